"""The GPU paths on a real GPU, and the advisor's estimates against what that GPU measures.

Run on a machine with a CUDA GPU (PyTorch with CUDA, torchvision, transformers; modelpress from
``src``). Each section is timed and written to ``--out`` (JSON) as soon as it ends, so a section
that fails loses only itself:

``env``         the GPU, driver, torch and onnxruntime builds, the host CPU.
``ceilings``    a bf16 8192^3 matrix product (TFLOP/s) and a device-to-device copy (GB/s).
``channels_last`` ResNet-50 inference again with channels-last tensors (what NVIDIA's own
                PyTorch numbers use).
``node_tests``  the ONNX backend node tests through modelpress' PyTorch backend on ``cuda:0``
                (``tests/runtime/test_torch_node_tests.py``), beside its pass rate on the CPU.
``backend``     torchvision's ResNet-50 converted by ``modelpress.convert``, then run by
                ``Session(backend="torch", device="cuda:0")``: its outputs against ONNX Runtime on
                the CPU, its time against the module's own in PyTorch, and a CPU/GPU split
                (the classifier pinned to the CPU).
``workloads``   the advisor's built-in workloads measured as a PyTorch user runs them: ResNet-50
                and BERT-base inference (fp16 autocast, eager) at batch 1, 32 and 256, ResNet-50
                training with AMP and Adam at batch 256, and Llama-2-7B's shape (random fp16
                weights) at batch 1, 16 and 64: a 128-token prefill, decode steps of
                transformers' ``generate`` (eager) and of a static-cache step replayed as a CUDA
                graph (what serving engines do).

``benchmarks/gpu_page.py`` puts the advisor's estimates beside these measurements
(``benchmarks/results/gpu.md``). ``--small`` runs every section with tiny shapes on whatever
device there is, to check the script itself.

    PYTHONPATH=src python3 benchmarks/bench_gpu.py --out gpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "tests" / "runtime")]

LLAMA_2_7B = dict(
    hidden_size=4096,
    intermediate_size=11008,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=32,
    vocab_size=32000,
    max_position_embeddings=4096,
    rope_theta=10000.0,
)
LLAMA_SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    vocab_size=128,
    max_position_embeddings=512,
    rope_theta=10000.0,
)


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device, *, warmup: int = 3, iters: int = 10) -> dict:
    """Median, min and max seconds of ``fn()`` over ``iters`` runs after ``warmup``."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "n": iters,
    }


def section_env(device, small):
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpu": platform.processor() or "",
        "cpu_count": os.cpu_count(),
    }
    try:
        info["cpu"] = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, sms=p.multi_processor_count, memory_gb=p.total_memory / 2**30)
        try:
            out = subprocess.run(
                [
                    "nvidia-smi",
                    "--query-gpu=driver_version,clocks.max.sm,power.limit",
                    "--format=csv,noheader",
                ],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.strip()
            info["nvidia_smi"] = out
        except (OSError, subprocess.SubprocessError) as exc:
            info["nvidia_smi"] = str(exc)
    import onnxruntime

    info["onnxruntime"] = onnxruntime.__version__
    info["ort_providers"] = onnxruntime.get_available_providers()
    for name in ("transformers", "torchvision", "onnx", "onnx_ir", "numpy"):
        try:
            info[name] = __import__(name).__version__
        except Exception as exc:  # noqa: BLE001 - recorded, not fatal
            info[name] = f"missing: {exc}"
    return info


def section_ceilings(device, small):
    n = 512 if small else 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    t = timed(lambda: a @ b, device, warmup=3, iters=10)
    size = (64 if small else 4096) * 2**20
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    c = timed(lambda: dst.copy_(src), device, warmup=3, iters=10)
    return {
        "gemm_n": n,
        "bf16_tflops": 2 * n**3 / t["median_s"] / 1e12,
        "gemm": t,
        "copy_bytes": size,
        "copy_gbs_read_plus_write": 2 * size / c["median_s"] / 1e9,
        "copy": c,
    }


def section_node_tests(device, small):
    import test_torch_node_tests as nt

    t = time.perf_counter()
    s = nt.run_node_tests(str(device))
    return {
        "device": str(device),
        "passed": len(s.passed),
        "failed": len(s.failed),
        "unrepresentable": len(s.unrepresentable),
        "rate": s.rate,
        "failures": [f"{n}: {w}" for n, w in s.failed[:60]],
        "seconds": time.perf_counter() - t,
    }


def section_backend(device, small):
    import modelpress
    from modelpress.runtime.session import Session

    torch.manual_seed(0)
    net = _resnet50(small).eval()
    batch = 4 if small else 32
    x = torch.randn(batch, 3, 224, 224)
    t = time.perf_counter()
    result = modelpress.convert(net, example_inputs=(x,))
    convert_s = time.perf_counter() - t
    model = result.model
    in_name = model.graph.inputs[0].name
    feeds = {in_name: x.numpy()}
    ort = Session(model, backend="ort", device="cpu")
    ref = next(iter(ort.run(feeds).values()))
    from modelpress.runtime.torch_backend import TorchBackend

    gpu = Session(model, backend="torch", device=str(device), strict=True)
    got = next(iter(gpu.run(feeds).values()))
    tf32 = Session(model, backend=TorchBackend(tf32=True), device=str(device), strict=True)
    got_tf32 = next(iter(tf32.run(feeds).values()))
    with torch.no_grad():
        eager = net.to(device)(x.to(device)).float().cpu().numpy()
    last_gemm = [n.name for n in model.graph if n.op_type in ("Gemm", "MatMul")][-1]
    split = Session(model, backend="torch", device=str(device), place=[f"{last_gemm}=cpu"])
    got_split = next(iter(split.run(feeds).values()))

    xb, fb = x, feeds
    # the backend's own run: numpy in, numpy out (copies included), as a user calls it
    t_backend = timed(lambda: gpu.run(fb), device, warmup=3, iters=10)
    t_backend_tf32 = timed(lambda: tf32.run(fb), device, warmup=3, iters=10)
    xd = xb.to(device)
    with torch.no_grad():
        t_torch = timed(lambda: net(xd), device, warmup=3, iters=10)
        t_torch_copies = timed(lambda: net(xb.to(device)).cpu(), device, warmup=3, iters=10)
    scale = float(np.abs(ref).max())
    return {
        "model": "small cnn" if small else "resnet50",
        "convert_s": convert_s,
        "convert": result.to_dict(),
        "max_abs_torch_cuda_vs_ort_cpu": float(np.abs(got - ref).max()),
        "max_abs_torch_cuda_tf32_vs_ort_cpu": float(np.abs(got_tf32 - ref).max()),
        "max_abs_pytorch_module_vs_ort_cpu": float(np.abs(eager - ref).max()),
        "max_abs_split_vs_ort_cpu": float(np.abs(got_split - ref).max()),
        "output_scale": scale,
        "split_pin": f"{last_gemm}=cpu",
        "split_log": split.plan.log_lines() if hasattr(split.plan, "log_lines") else [],
        "batch": batch,
        "backend_fp32": t_backend,
        "backend_tf32": t_backend_tf32,
        "pytorch_fp32_on_device": t_torch,
        "pytorch_fp32_with_copies": t_torch_copies,
    }


def _resnet50(small: bool) -> torch.nn.Module:
    """torchvision's ResNet-50 (random weights); with ``small`` a few conv layers in its style."""
    if not small:
        import torchvision

        return torchvision.models.resnet50()
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 8, 7, 2, 3),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
        nn.Conv2d(8, 16, 3, 2, 1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )


def _infer_rate(net, inputs, batch, device, *, amp=True, iters=10):
    def run():
        with (
            torch.no_grad(),
            torch.autocast("cuda", torch.float16, enabled=amp and device.type == "cuda"),
        ):
            net(*inputs)

    t = timed(run, device, warmup=3, iters=iters)
    return {"batch": batch, **t, "per_s": batch / t["median_s"]}


def section_workloads(device, small):
    import transformers

    out = {}
    torch.manual_seed(0)
    # ResNet-50: inference (fp16 autocast, eager) and training (AMP, Adam)
    net = _resnet50(small).to(device).eval()
    out["resnet50_infer"] = []
    for b in (1, 2) if small else (1, 32, 256):
        x = torch.randn(b, 3, 224, 224, device=device)
        out["resnet50_infer"].append(_infer_rate(net, (x,), b, device))
        log(
            "resnet50 infer", out["resnet50_infer"][-1]["batch"], out["resnet50_infer"][-1]["per_s"]
        )
    net.train()
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler(enabled=device.type == "cuda")
    b = 4 if small else 256
    x = torch.randn(b, 3, 224, 224, device=device)
    y = torch.randint(0, 10 if small else 1000, (b,), device=device)

    def train_step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", torch.float16, enabled=device.type == "cuda"):
            loss = torch.nn.functional.cross_entropy(net(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    t = timed(train_step, device, warmup=3, iters=5 if small else 10)
    out["resnet50_train"] = {"batch": b, **t, "per_s": b / t["median_s"]}
    log("resnet50 train", out["resnet50_train"]["per_s"])
    # BERT-base, sequence 128 (fp16 autocast, eager)
    cfg = (
        transformers.BertConfig()
        if not small
        else transformers.BertConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128
        )
    )
    bert = transformers.BertModel(cfg).to(device).eval()
    out["bert_base_infer"] = []
    for b in (1, 2) if small else (1, 32, 256):
        ids = torch.randint(0, cfg.vocab_size, (b, 128), device=device)
        out["bert_base_infer"].append(_infer_rate(bert, (ids,), b, device))
        log("bert infer", b, out["bert_base_infer"][-1]["per_s"])
    if device.type == "cuda":
        torch.cuda.empty_cache()
    out["llama"] = _llama(device, small)
    return out


def _llama_model(device, small):
    import transformers

    shape = LLAMA_SMALL if small else LLAMA_2_7B
    cfg = transformers.LlamaConfig(**shape)
    cfg._attn_implementation = "sdpa"
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = transformers.LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    with torch.no_grad():  # weights of a trained model's scale (the init leaves norms at 1)
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02)
    return model.eval(), shape, dtype


class StaticDecoder:
    """One decode step of a Llama model over a preallocated cache: fixed shapes, capturable."""

    def __init__(self, model, batch: int, max_len: int, theta: float, device, dtype):
        c = model.config
        self.m, self.batch, self.max_len = model, batch, max_len
        self.heads, self.kv = c.num_attention_heads, c.num_key_value_heads
        self.hd = c.hidden_size // self.heads
        shape = (c.num_hidden_layers, batch, self.kv, max_len, self.hd)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.inv = 1.0 / theta ** (torch.arange(0, self.hd, 2, device=device).float() / self.hd)
        self.cols = torch.arange(max_len, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.tok = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.dtype = dtype

    @staticmethod
    def _rot(x, cos, sin):
        h = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin

    def step(self):
        """Embeds ``tok`` at ``pos``, writes its keys/values, returns logits; advances both."""
        m, b = self.m, self.batch
        x = m.model.embed_tokens(self.tok)
        ang = self.pos.float()[:, None] * self.inv
        cos = torch.cat((ang.cos(), ang.cos()), -1).to(self.dtype)
        sin = torch.cat((ang.sin(), ang.sin()), -1).to(self.dtype)
        mask = (self.cols <= self.pos)[None, None, None, :]
        for i, layer in enumerate(m.model.layers):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            q = a.q_proj(h).view(b, 1, self.heads, self.hd).transpose(1, 2)
            k = a.k_proj(h).view(b, 1, self.kv, self.hd).transpose(1, 2)
            v = a.v_proj(h).view(b, 1, self.kv, self.hd).transpose(1, 2)
            q, k = self._rot(q, cos, sin), self._rot(k, cos, sin)
            self.k[i].index_copy_(2, self.pos, k)
            self.v[i].index_copy_(2, self.pos, v)
            o = torch.nn.functional.scaled_dot_product_attention(
                q, self.k[i], self.v[i], attn_mask=mask, enable_gqa=self.kv != self.heads
            )
            x = x + a.o_proj(o.transpose(1, 2).reshape(b, 1, self.heads * self.hd))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        logits = m.lm_head(m.model.norm(x))
        self.tok.copy_(logits.argmax(-1))
        self.pos.add_(1)
        return logits


def _llama(device, small):
    model, shape, dtype = _llama_model(device, small)
    out = {"shape": shape, "dtype": str(dtype), "prompt": 128, "new_tokens": 128, "rows": []}
    prompt, new = 128, (16 if small else 128)
    gen = torch.Generator(device="cpu").manual_seed(0)
    # correctness of the static step: logits along a sequence against transformers' forward
    ids = torch.randint(0, shape["vocab_size"], (1, 16), generator=gen).to(device)
    with torch.no_grad():
        ref = model(ids).logits[0].float()
        dec = StaticDecoder(model, 1, 32, shape["rope_theta"], device, dtype)
        steps = []
        for j in range(ids.shape[1]):
            dec.tok.copy_(ids[:, j : j + 1])
            steps.append(dec.step()[0, 0].float())
        mine = torch.stack(steps)
    out["static_vs_transformers_max_abs"] = float((mine - ref).abs().max())
    out["logit_scale"] = float(ref.abs().max())
    out["static_vs_transformers_top1_equal"] = float(
        (mine.argmax(-1) == ref.argmax(-1)).float().mean()
    )
    log("static step check", out["static_vs_transformers_max_abs"], out["logit_scale"])
    for b in (1, 2) if small else (1, 16, 64):
        ids = torch.randint(0, shape["vocab_size"], (b, prompt), generator=gen).to(device)
        with torch.no_grad():
            row = _llama_row(model, ids, new, shape["rope_theta"], device, dtype)
        out["rows"].append(row)
        log("llama", b, row["prefill"]["median_s"], row["eager_step_s"], row["graph_step_s"])
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def _llama_row(model, ids, new: int, theta: float, device, dtype) -> dict:
    """One batch: the prompt's prefill, ``generate``'s decode step, the static step as a graph."""
    b, prompt = ids.shape
    mask = torch.ones_like(ids)
    row = {"batch": b}
    row["prefill"] = timed(lambda: model(ids, use_cache=False), device, warmup=2, iters=5)

    def generate(n):
        return model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
        )

    g1 = timed(lambda: generate(1), device, warmup=1, iters=3)
    gn = timed(lambda: generate(new), device, warmup=1, iters=3)
    row["generate_total"] = gn
    row["eager_step_s"] = (gn["median_s"] - g1["median_s"]) / (new - 1)
    dec = StaticDecoder(model, b, prompt + new, theta, device, dtype)
    for _ in range(3):  # warm-up before the capture
        dec.pos.fill_(prompt)
        dec.step()
    dec.pos.fill_(prompt)
    replay = dec.step
    if device.type == "cuda":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            dec.step()
        replay = graph.replay

    def one_eager_step():
        dec.pos.fill_(prompt)
        dec.step()

    row["static_eager_step_s"] = timed(one_eager_step, device, warmup=2, iters=5)["median_s"]

    def run_graph():
        dec.pos.fill_(prompt)
        for _ in range(new - 1):
            replay()

    t = timed(run_graph, device, warmup=1, iters=3)
    row["graph_step_s"] = t["median_s"] / (new - 1)
    row["graph_total"] = t
    return row


def section_channels_last(device, small):
    """ResNet-50 inference as above, with the input and weights in channels-last layout."""
    net = _resnet50(small).to(device).eval().to(memory_format=torch.channels_last)
    rows = []
    for b in (1, 2) if small else (1, 32, 256):
        x = torch.randn(b, 3, 224, 224, device=device).to(memory_format=torch.channels_last)
        rows.append(_infer_rate(net, (x,), b, device))
        log("resnet50 channels_last", b, rows[-1]["per_s"])
    return {"resnet50_infer": rows}


SECTIONS = {
    "env": section_env,
    "ceilings": section_ceilings,
    "node_tests": section_node_tests,
    "backend": section_backend,
    "workloads": section_workloads,
    "channels_last": section_channels_last,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu.json")
    ap.add_argument("--only", action="append", choices=list(SECTIONS))
    ap.add_argument("--small", action="store_true", help="tiny shapes, any device")
    args = ap.parse_args()
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.small:
        print("no CUDA GPU here: run with --small to check the script", file=sys.stderr)
        return 2
    results = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "small": args.small}
    for name in args.only or list(SECTIONS):
        log("section", name)
        t = time.perf_counter()
        try:
            results[name] = SECTIONS[name](device, args.small)
        except Exception as exc:  # noqa: BLE001 - one section's failure is recorded, not fatal
            traceback.print_exc()
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        results.setdefault("seconds", {})[name] = time.perf_counter() - t
        Path(args.out).write_text(json.dumps(results, indent=1, default=str))
        log("section", name, "done in", round(time.perf_counter() - t, 1), "s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
