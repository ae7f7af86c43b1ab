"""``benchmarks/results/gpu.md`` from a run of ``bench_gpu.py``: what the GPU measured, beside
what ``modelpress advise`` estimates for the same workload, batch and engine on that GPU.

The advisor was never fitted on these measurements: each row is a held-out check of it.

    .venv/bin/python benchmarks/gpu_page.py RUN.json [RUN2.json ...] [--gpu H200]

Several runs merge section by section, a later run's section replacing an earlier one's.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
MODELPRESS = [sys.executable, "-m", "modelpress.cli.main"]


def advise(gpu: str, workload: str, batch: int, engine: str, *, task="infer", seq=None, gen=None):
    """The advisor's estimate (its JSON record's device row) for one configuration."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "a.json"
        cmd = MODELPRESS + [
            "advise",
            "--workload",
            workload,
            "--gpu",
            gpu,
            "--engine",
            engine,
            "--precision",
            "fp16",
            "--batch-size",
            str(batch),
            "--task",
            task,
            "--no-cpu",
            "--optimizer",
            "adam",
            "--json",
            str(out),
        ]
        if seq:
            cmd += ["--seq", str(seq)]
        if gen:
            cmd += ["--gen-tokens", str(gen)]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        row = json.loads(out.read_text())["result"]["devices"][0]
    phases = {}
    for note in row.get("notes", []):
        m = re.search(r"prefill ([\d.]+) ms, \d+ decode steps of ([\d.]+) ms", note)
        if m:
            phases = {"prefill_ms": float(m.group(1)), "step_ms": float(m.group(2))}
    return {**row, **phases}


def ratio(pred: float, meas: float) -> str:
    return f"{pred / meas:.2f}"


def rows(run: dict, gpu: str) -> list[list[str]]:
    w = run["workloads"]
    table = []
    for name, key, unit in (
        ("resnet50", "resnet50_infer", "images/s"),
        ("bert-base", "bert_base_infer", "sequences/s"),
    ):
        for r in w[key]:
            b = r["batch"]
            seq = 128 if name == "bert-base" else None
            e = advise(gpu, name, b, "eager", seq=seq)
            c = advise(gpu, name, b, "compiled", seq=seq)
            table.append(
                [
                    f"{name} infer fp16 (autocast, eager)",
                    str(b),
                    f"{r['per_s']:,.0f} {unit}",
                    f"{e['throughput']:,.0f}",
                    ratio(e["throughput"], r["per_s"]),
                    f"({c['throughput']:,.0f})",
                    "-",
                ]
            )
    for r in run.get("channels_last", {}).get("resnet50_infer", []):
        e = advise(gpu, "resnet50", r["batch"], "eager")
        c = advise(gpu, "resnet50", r["batch"], "compiled")
        table.append(
            [
                "resnet50 infer fp16 (autocast, eager), channels-last",
                str(r["batch"]),
                f"{r['per_s']:,.0f} images/s",
                f"{e['throughput']:,.0f}",
                ratio(e["throughput"], r["per_s"]),
                f"({c['throughput']:,.0f})",
                "-",
            ]
        )
    r = w["resnet50_train"]
    e = advise(gpu, "resnet50", r["batch"], "eager", task="train")
    table.append(
        [
            "resnet50 train AMP + Adam",
            str(r["batch"]),
            f"{r['per_s']:,.0f} images/s",
            f"{e['throughput']:,.0f}",
            ratio(e["throughput"], r["per_s"]),
            "-",
            "-",
        ]
    )
    llama = w["llama"]
    for r in llama["rows"]:
        b = r["batch"]
        e = advise(gpu, "llama-2-7b", b, "eager", seq=llama["prompt"], gen=llama["new_tokens"])
        c = advise(gpu, "llama-2-7b", b, "compiled", seq=llama["prompt"], gen=llama["new_tokens"])
        pre = r["prefill"]["median_s"] * 1e3
        table.append(
            [
                "llama-2-7b prefill of 128 (fp16, transformers)",
                str(b),
                f"{pre:.1f} ms",
                f"{e['prefill_ms']:.1f} ms",
                ratio(1 / e["prefill_ms"], 1 / pre),
                f"({c['prefill_ms']:.1f} ms)",
                "-",
            ]
        )
        ms = r["eager_step_s"] * 1e3
        table.append(
            [
                "llama-2-7b decode step, transformers generate",
                str(b),
                f"{ms:.2f} ms ({b / r['eager_step_s']:,.0f} tok/s)",
                f"{e['step_ms']:.2f} ms",
                ratio(1 / e["step_ms"], 1 / ms),
                f"({c['step_ms']:.2f} ms)",
                "-",
            ]
        )
        ms = r["graph_step_s"] * 1e3
        table.append(
            [
                "llama-2-7b decode step, static cache + CUDA graph",
                str(b),
                f"{ms:.2f} ms ({b / r['graph_step_s']:,.0f} tok/s)",
                f"({e['step_ms']:.2f} ms)",
                "-",
                f"{c['step_ms']:.2f} ms",
                ratio(1 / c["step_ms"], 1 / ms),
            ]
        )
    return table


def page(run: dict, gpu: str) -> str:
    env = run["env"]
    lines = [
        "# The GPU paths on a real GPU, and the advisor against it (`benchmarks/bench_gpu.py`)",
        "",
        f"Machine: {env.get('gpu')} ({env.get('sms')} SMs, {env.get('memory_gb', 0):.0f} GiB; "
        f"nvidia-smi: {env.get('nvidia_smi')}), host {env.get('cpu')} ({env.get('cpu_count')} "
        f"cores); torch {env.get('torch')} (CUDA {env.get('cuda')}), transformers "
        f"{env.get('transformers')}, onnxruntime {env.get('onnxruntime')} (providers: "
        f"{', '.join(env.get('ort_providers', []))}), Python {env.get('python')}. Date: "
        f"{run['date']}. Command: `PYTHONPATH=src python3 benchmarks/bench_gpu.py --out gpu.json`, "
        f"then `python benchmarks/gpu_page.py gpu.json`.",
        "",
    ]
    c = run.get("ceilings", {})
    if "bf16_tflops" in c:
        lines += [
            f"Ceilings measured in the same run: bf16 {c['gemm_n']}^3 matrix product "
            f"{c['bf16_tflops']:.0f} TFLOP/s; device-to-device copy "
            f"{c['copy_gbs_read_plus_write'] / 1e3:.2f} TB/s (bytes read plus written).",
            "",
        ]
    nt = run.get("node_tests", {})
    if "passed" in nt:
        lines += [
            "## The PyTorch backend on the GPU: ONNX's node tests",
            "",
            f"On `{nt['device']}`: {nt['passed']} of {nt['passed'] + nt['failed']} representable "
            f"cases over the claimed ops passed ({nt['rate']:.1%}); {nt['unrepresentable']} use "
            f"element types torch lacks. {nt['seconds']:.0f} s.",
            "",
        ]
        if nt["failures"]:
            lines += ["Failing on the GPU:", ""] + [f"- `{f}`" for f in nt["failures"]] + [""]
    b = run.get("backend", {})
    if "batch" in b:
        t = b["backend_fp32"]["median_s"] * 1e3
        p = b["pytorch_fp32_on_device"]["median_s"] * 1e3
        pc = b["pytorch_fp32_with_copies"]["median_s"] * 1e3
        lines += [
            "## A converted model on the GPU (`Session(backend='torch', device='cuda:0')`)",
            "",
            f"torchvision's {b['model']} (random weights) converted by `modelpress.convert` "
            f"(verified against PyTorch on the CPU: {b['convert']['verify']['passed']}), batch "
            f"{b['batch']}, fp32:",
            "",
            "| | value |",
            "| --- | --- |",
            f"| max abs, PyTorch backend on the GPU vs ONNX Runtime on the CPU | "
            f"{b['max_abs_torch_cuda_vs_ort_cpu']:.2e} (outputs up to {b['output_scale']:.2f}) |",
            f"| max abs, the same with `TorchBackend(tf32=True)` | "
            f"{b['max_abs_torch_cuda_tf32_vs_ort_cpu']:.2e} |",
            f"| max abs, the PyTorch module on the GPU (PyTorch's defaults) vs ONNX Runtime | "
            f"{b['max_abs_pytorch_module_vs_ort_cpu']:.2e} |",
            f"| max abs, split (`{b['split_pin']}`) vs ONNX Runtime on the CPU | "
            f"{b['max_abs_split_vs_ort_cpu']:.2e} |",
            f"| split plan | {b['split_log'][-1] if b['split_log'] else '-'} |",
            f"| `Session.run`, numpy in and out (IEEE float32, the default) | {t:.2f} ms |",
            f"| `Session.run` with `TorchBackend(tf32=True)` | "
            f"{b['backend_tf32']['median_s'] * 1e3:.2f} ms |",
            f"| the PyTorch module, tensors on the GPU (PyTorch's defaults: TF32 convolutions) | "
            f"{p:.2f} ms |",
            f"| the PyTorch module, copies to and from the host | {pc:.2f} ms |",
            "",
        ]
    if "llama" in run.get("workloads", {}):
        llama = run["workloads"]["llama"]
        lines += [
            f"## The advisor's estimates for the {gpu} against the measurements",
            "",
            "Ratio = estimated / measured throughput (above 1: the advisor is optimistic). "
            "Eager and compiled are `advise --engine eager|compiled --precision fp16`; each "
            "measurement is compared with the engine it ran on (the other estimate in brackets).",
            "",
            "| workload | batch | measured | advise eager | ratio | advise compiled | ratio |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        lines += ["| " + " | ".join(r) + " |" for r in rows(run, gpu)]
        lines += [
            "",
            f"Llama rows: Llama-2-7B's shape ({llama['dtype']} weights, random), prompt "
            f"{llama['prompt']}, {llama['new_tokens']} new tokens. The static step (one decode "
            "step over a preallocated cache, replayed as a CUDA graph) matches transformers' "
            f"logits to {llama['static_vs_transformers_max_abs']:.2e} (logits up to "
            f"{llama['logit_scale']:.2f}; top-1 equal {llama['static_vs_transformers_top1_equal']:.0%}).",
            "",
        ]
    return "\n".join(lines)


NOTES = "\n## Notes on the runs above (written by hand)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--gpu", default="H200")
    args = ap.parse_args()
    run: dict = {"dates": []}
    for path in args.runs:
        part = json.loads(Path(path).read_text())
        run["dates"].append(part.pop("date"))
        run.update({k: v for k, v in part.items() if k not in ("seconds", "small")})
    run["date"] = ", ".join(run["dates"])
    (RESULTS / "gpu.json").write_text(json.dumps(run, indent=1))
    target = RESULTS / "gpu.md"
    old = target.read_text() if target.exists() else ""
    notes = old[old.index(NOTES) :] if NOTES in old else ""
    target.write_text(page(run, args.gpu) + notes)
    print(RESULTS / "gpu.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
