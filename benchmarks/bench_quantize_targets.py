"""int8 per target CPU format: accuracy on a CPU with VNNI and on one without, and latency here.

For each model and mode, the model is quantized twice: for ``vnni`` CPUs (plain int8 weights) and
for ``avx2`` CPUs (pair-safe weights, also what ``portable`` writes). Each file is then scored

- on this machine, under ONNX Runtime's default optimizations (what users run);
- on an emulated Haswell (``qemu-x86_64 -cpu Haswell``: AVX2, no AVX-512 or VNNI), where ONNX
  Runtime picks the kernels that add u8·s8 products in saturating int16 pairs, as a real AVX2 CPU
  does. Emulation gives that CPU's arithmetic, not its speed: no timing there;

and timed here against float32 (interleaved, one global thread pool, median and p25-p75).

Models (built by code): resnet-digits and mobilenet-digits (top-1 accuracy on held-out digits,
static int8) and MiniLM (mean cosine of sentence embeddings against float32, dynamic and static).

    .venv/bin/python benchmarks/bench_quantize_targets.py

Writes benchmarks/results/quantize_targets.md and quantize_targets.json.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
WORK = ROOT / "_work" / "quantize_targets"
RESULTS = ROOT / "results"
TARGETS = ("vnni", "avx2")
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")


def data(name: str) -> dict:
    """Inputs to score on (and reference outputs' kind) and calibration batches."""
    if name == "minilm":
        from bench_quantize import sentences, tokenize

        test = tokenize(sentences(64, seed=1), 64)
        cal = tokenize(sentences(64, seed=2), 64)
        calib = [{k: v[i : i + 16] for k, v in cal.items()} for i in range(0, 64, 16)]
        return {"test": test, "labels": None, "calib": calib}
    from modelpress import zoo

    d = zoo.digits_data()
    calib = [{"image": d.x_train[i : i + 32]} for i in range(0, 256, 32)]
    return {"test": {"image": d.x_test}, "labels": d.y_test, "calib": calib}


def outputs(path: Path, feeds: dict, batch: int = 32) -> np.ndarray:
    from modelpress.runtime.ort import session

    s = session(str(path))
    n = len(next(iter(feeds.values())))
    return np.concatenate(
        [
            s.run(None, {k: v[i : i + batch] for k, v in feeds.items()})[0]
            for i in range(0, n, batch)
        ]
    )


def score(out: np.ndarray, labels, ref: np.ndarray) -> float:
    if labels is not None:
        return float((out.argmax(axis=-1) == labels).mean())
    a = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    b = out / np.linalg.norm(out, axis=1, keepdims=True)
    return float((a * b).sum(axis=1).mean())


def evaluate(spec_path: str, result_path: str) -> None:
    """Child: score every model of a spec (run here, or under qemu)."""
    spec = json.loads(Path(spec_path).read_text())
    if spec.get("one_thread"):  # under qemu-user, whose threads are its fragile part
        from modelpress.runtime.ort import use_global_thread_pool

        use_global_thread_pool(1)
    name = spec["model"]
    d = data(name)
    ref = outputs(Path(spec["paths"]["float32"]), d["test"])
    got = {
        k: score(outputs(Path(p), d["test"]), d["labels"], ref) for k, p in spec["paths"].items()
    }
    from modelpress.runtime.cpu import int8_capability

    got["_cpu"] = int8_capability().to_dict()
    Path(result_path).write_text(json.dumps(got))


def run_child(spec: dict, emulated: bool) -> dict:
    spec_path = WORK / f"{spec['model']}_{spec['mode']}_spec.json"
    result_path = WORK / f"{spec['model']}_{spec['mode']}_{'qemu' if emulated else 'here'}.json"
    spec_path.write_text(json.dumps({**spec, "one_thread": emulated}))
    cmd = [sys.executable, __file__, "--evaluate", str(spec_path), str(result_path)]
    if emulated:
        cmd = [shutil.which("qemu-x86_64"), "-cpu", "Haswell", *cmd]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT.parent / "src")]))
    if emulated:  # numpy's AVX2 kernels crash qemu now and then; ONNX Runtime's keep AVX2
        env["NPY_DISABLE_CPU_FEATURES"] = "X86_V3 X86_V4"
    for _attempt in range(3):  # qemu-user itself crashes now and then (SIGSEGV)
        done = subprocess.run(cmd, env=env, stderr=subprocess.DEVNULL)
        if done.returncode == 0:
            break
    done.check_returncode()
    return json.loads(result_path.read_text())


def latency(paths: dict[str, Path], feeds: dict[int, dict], reps: int) -> dict:
    from modelpress.runtime.measure import time_interleaved
    from modelpress.runtime.ort import session, use_global_thread_pool

    use_global_thread_pool()
    out = {k: {} for k in paths}
    sessions = {k: session(str(p)) for k, p in paths.items()}
    for batch, f in feeds.items():
        fns = [lambda s=s, f=f: s.run(None, f) for s in sessions.values()]
        for k, t in zip(sessions, time_interleaved(fns, runs=reps, warmup=10), strict=True):
            out[k][batch] = (t.median_ms, t.p25_ms, t.p75_ms)
    return out


def bench(name: str, mode: str) -> dict:
    import modelpress
    from modelpress import zoo
    from modelpress.compress import quantize

    src = WORK / f"{name}.onnx"
    zoo.build(name, src)
    d = data(name)
    paths = {"float32": src}
    notes = {}
    for target in TARGETS:
        r = quantize(src, mode=mode, data=d["calib"], target_cpu=target)
        p = WORK / f"{name}_{mode}_{target}.onnx"
        modelpress.save(r.model, p)
        paths[f"int8 for {target}"] = p
        notes[target] = {"failures": r.failures, "reference": r.check.reference_error}
    spec = {"model": name, "mode": mode, "paths": {k: str(v) for k, v in paths.items()}}
    here = run_child(spec, emulated=False)
    emulated = run_child(spec, emulated=True) if shutil.which("qemu-x86_64") else None
    f1 = {k: v[:1] for k, v in d["test"].items()}
    f8 = {k: v[:8] for k, v in d["test"].items()}
    lat = latency(paths, {1: f1, 8: f8}, reps=100 if name == "minilm" else 300)
    return {
        "model": name,
        "mode": mode,
        "here": here,
        "emulated": emulated,
        "latency": lat,
        "notes": notes,
    }


def cpu_flags() -> list[str]:
    from modelpress.runtime.cpu import cpu_flags as flags

    have = flags()
    return [f for f in FLAGS if f in have]


def report(results: list[dict], seconds: float) -> str:
    from modelpress.runtime.cpu import int8_capability

    here = int8_capability()
    lines = [
        "# int8 per target CPU format",
        "",
        f"Date: {dt.date.today()}. Machine: {platform.machine()}, {os.cpu_count()} logical CPUs "
        f"(shared), flags {', '.join(cpu_flags()) or 'none of ' + ', '.join(FLAGS)}; ONNX Runtime's "
        f"int8 sums here: {here.describe()}. Emulated CPU: `qemu-x86_64 -cpu Haswell` (AVX2, no "
        "AVX-512, no VNNI; the probe there measures saturating sums). Command: "
        f"`.venv/bin/python benchmarks/bench_quantize_targets.py` ({seconds / 60:.0f} min).",
        "",
        "Metric: top-1 accuracy on the held-out digits (CNNs), mean cosine of sentence embeddings "
        "against float32 (MiniLM, 64 sentences of 64 tokens). Latency: ONNX Runtime CPU here, ms, "
        "median (p25–p75), interleaved with float32 on one global thread pool.",
        "",
        "| model | mode | format | metric here | metric on AVX2 (emulated) | ms batch 1 | ms batch 8 | vs float b1 / b8 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lat = r["latency"]
        for k in lat:
            emu = r["emulated"][k] if r["emulated"] else None
            b1, b8 = lat[k][1], lat[k][8]
            ratio = f"{b1[0] / lat['float32'][1][0]:.2f} / {b8[0] / lat['float32'][8][0]:.2f}"
            lines.append(
                f"| {r['model']} | {r['mode']} | {k} | {r['here'][k]:.4f} | "
                f"{'' if emu is None else f'{emu:.4f}'} | {b1[0]:.3f} ({b1[1]:.3f}–{b1[2]:.3f}) | "
                f"{b8[0]:.3f} ({b8[1]:.3f}–{b8[2]:.3f}) | {ratio} |"
            )
    lines += [
        "",
        "Reading: `int8 for vnni` is what a quantizer that ignores the target writes. On a CPU "
        "without VNNI its u8·s8 pair sums saturate wherever two neighbouring weights of one sign "
        "are large; `int8 for avx2` keeps every such pair within int16 and runs on the same "
        "kernels, so its speed here is the plain format's.",
        "",
        "Check results (`quantize` refuses a model whose deployed error is far beyond its reference "
        "error, and a static model slower than float here):",
        "",
    ]
    for r in results:
        for target, n in r["notes"].items():
            lines.append(
                f"- {r['model']} {r['mode']} for {target}: reference error {n['reference']:.3g}; "
                f"failures here: {'; '.join(n['failures']) or 'none'}"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--evaluate":
        evaluate(sys.argv[2], sys.argv[3])
        return
    WORK.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    cases = [
        ("resnet-digits", "static"),
        ("mobilenet-digits", "static"),
        ("minilm", "dynamic"),
        ("minilm", "static"),
    ]
    results = []
    for name, mode in cases:
        print(f"{name} {mode} ...", flush=True)
        results.append(bench(name, mode))
    (RESULTS / "quantize_targets.json").write_text(json.dumps(results, indent=1))
    text = report(results, time.perf_counter() - t0)
    (RESULTS / "quantize_targets.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
