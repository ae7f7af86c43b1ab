"""Quantization of real, full-size architectures: torchvision's model definitions at 224x224.

The zoo and ``bench_quantize_unseen.py`` cover small, trained networks; this sweep checks that the
defaults hold on the architectures users actually ship: their operator mix (depthwise and grouped
convolutions, squeeze-excite, SiLU / Hardswish, channel shuffle, LayerNorm in NCHW CNNs, window
attention) and their sizes, where int8's speed-up or slow-down is what a deployment would see.

No weights are downloaded (the machine has no internet and modelpress never fetches any): each
model is built with torchvision's random initialisation, then its BatchNorm statistics are set by
three training-mode passes over synthetic images, so that activations neither vanish nor explode
through the depth of the network. Accuracy is therefore not measured; what is measured is how far
int8 moves the outputs (cosine similarity of the logits, each centred on its mean, and the
signal-to-quantization-noise ratio, on 64 held-out synthetic images; top-1 agreement is not
reported: untrained heads leave near-ties that any rounding flips) and how fast it runs.

Segmentation models: LR-ASPP and DeepLabV3 on MobileNetV3, without a pretrained backbone. CNNs: ``mode="static"`` (64 calibration images in batches of 16); transformers (ViT, Swin):
``mode="dynamic"`` with the same calibration data (outlier smoothing). Every other option is the
default. Latency: ONNX Runtime CPU, all optimizations, the optimized float32 model against the int8
one, interleaved in one process on one global thread pool (``bench_quantize.latency``), median and
p25-p75 in ms; batch 8 only where float32 batch 1 takes under 25 ms.

torchvision is used for its pure-Python model definitions only. The PyPI wheel's compiled
operators link CUDA libraries that the CPU build of torch does not ship, so the module that
registers them is stubbed before the import, and the wheel is installed apart from the virtual
environment (``--target benchmarks/_work/torchvision``, ``make bench`` does it): installed into it,
it breaks every other ``import torchvision``, transformers' among them.

    .venv/bin/pip install --no-deps --target benchmarks/_work/torchvision torchvision==0.28.0
    .venv/bin/python benchmarks/bench_quantize_torchvision.py [--models resnet18 vit_b_16 ...]

Writes benchmarks/results/quantize_torchvision.md (a partial run writes under benchmarks/_work/).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
import types
from pathlib import Path

import numpy as np
from bench_quantize import latency, size

HERE = Path(__file__).resolve().parent
WORK = HERE / "_work" / "quantize_torchvision"
TORCHVISION = HERE / "_work" / "torchvision"  # installed apart from .venv: see the docstring
RESULTS = HERE / "results"
SIZE = 224
STATIC = [
    "resnet18",
    "resnet50",
    "resnext50_32x4d",
    "mobilenet_v2",
    "mobilenet_v3_large",
    "mobilenet_v3_small",
    "efficientnet_b0",
    "googlenet",
    "densenet121",
    "shufflenet_v2_x1_0",
    "regnet_y_400mf",
    "squeezenet1_1",
    "mnasnet1_0",
    "convnext_tiny",
    "lraspp_mobilenet_v3_large",
    "deeplabv3_mobilenet_v3_large",
]
SEGMENTATION = {"lraspp_mobilenet_v3_large", "deeplabv3_mobilenet_v3_large"}
DYNAMIC = ["vit_b_16", "swin_t"]
ALL = STATIC + DYNAMIC


def _torchvision():
    if not TORCHVISION.is_dir():
        raise SystemExit(
            f"torchvision is not in {TORCHVISION}: .venv/bin/pip install --no-deps --target "
            f"{TORCHVISION} torchvision==0.28.0"
        )
    sys.path.insert(0, str(TORCHVISION))
    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("stub"))
    import torchvision

    return torchvision


def images(rng: np.random.Generator, n: int) -> np.ndarray:
    """Smooth blobs plus noise, roughly unit variance: ImageNet-normalised pictures' statistics."""
    coarse = rng.standard_normal((n, 3, SIZE // 8, SIZE // 8)).astype(np.float32)
    fine = 0.3 * rng.standard_normal((n, 3, SIZE, SIZE)).astype(np.float32)
    return np.repeat(np.repeat(coarse, 8, 2), 8, 3) + fine


def _OutOnly(net):  # noqa: N802 - a class made on demand, so torch is imported lazily
    import torch

    class OutOnly(torch.nn.Module):
        """Segmentation models return a dict; the deployed graph has one output, ``out``."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)["out"]

    return OutOnly(net)


def build(name: str, rng: np.random.Generator):
    import torch

    torch.manual_seed(0)
    models = _torchvision().models
    if name in SEGMENTATION:  # no pretrained backbone (its default would be downloaded)
        net = _OutOnly(getattr(models.segmentation, name)(weights=None, weights_backbone=None))
    else:
        net = getattr(models, name)()
    for mod in net.modules():  # a zero-initialised head (ViT) would make every logit 0
        if isinstance(mod, torch.nn.Linear) and not mod.weight.detach().abs().sum():
            torch.nn.init.normal_(mod.weight, std=0.02)
    net.train()
    with torch.no_grad():
        for _ in range(3):
            net(torch.from_numpy(images(rng, 8)))
    net.eval()
    if hasattr(net, "aux_logits"):  # GoogLeNet returns a namedtuple in training mode only
        net.aux_logits = False
    return net


def run_case(name: str, reps: int) -> dict:
    import onnxruntime as ort
    import torch

    from modelpress import load, save
    from modelpress.compress import quantize
    from modelpress.convert import convert
    from modelpress.passes import optimize

    rng = np.random.default_rng(0)
    row: dict = {"model": name, "mode": "dynamic" if name in DYNAMIC else "static"}
    start = time.perf_counter()
    stage = "build"
    try:
        net = build(name, rng)
        row["params_m"] = sum(p.numel() for p in net.parameters()) / 1e6
        fp, op, qp = WORK / f"{name}.onnx", WORK / f"{name}_opt.onnx", WORK / f"{name}_int8.onnx"
        stage = "convert"
        convert(
            net, example_inputs=(torch.randn(1, 3, SIZE, SIZE),), dynamic={"x": (0,)}, output=fp
        )
        save(optimize(load(fp), level=2).model, op)
        stage = "quantize"
        calib = [{"x": images(rng, 16)} for _ in range(4)]
        t0 = time.perf_counter()
        r = quantize(fp, mode=row["mode"], data=calib)
        save(r.model, qp)
        row["quantize_s"] = time.perf_counter() - t0
        row["size_ratio"] = size(qp) / size(fp)
        row["layers"] = f"{sum(x.quantized for x in r.layers)}/{len(r.layers)}"
        stage = "score"
        so = ort.SessionOptions()
        so.log_severity_level = 3
        x = images(rng, 64)
        runs = [ort.InferenceSession(str(p), so).run for p in (op, qp)]
        ref, got = (
            np.concatenate([run(None, {"x": x[i : i + 16]})[0] for i in range(0, 64, 16)])
            for run in runs
        )
        ref, got = (a.reshape(a.shape[0], -1) for a in (ref, got))
        ref, got = ref - ref.mean(1, keepdims=True), got - got.mean(1, keepdims=True)
        cos = (ref * got).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(got, axis=1)
        row["cosine"] = float(cos.mean())
        row["sqnr_db"] = float(10 * np.log10((ref**2).sum() / max(((ref - got) ** 2).sum(), 1e-30)))
        stage = "latency"
        paths = {"float32": op, "int8": qp}
        lat = latency(paths, {1: {"x": images(rng, 1)}}, reps=reps)
        if lat["float32"][1][0] < 25:
            lat8 = latency(paths, {8: {"x": images(rng, 8)}}, reps=max(5, reps // 3))
            for k in lat:
                lat[k].update(lat8[k])
        row["latency"] = lat
    except Exception as exc:  # noqa: BLE001 - a failure is a finding, not the end of the sweep
        text = str(exc).strip().splitlines()
        row["error"] = f"{stage}: {type(exc).__name__}: {text[0][:300] if text else ''}"
    row["seconds"] = time.perf_counter() - start
    return row


def _lat(row: dict, b: int) -> tuple[str, str]:
    lat = row.get("latency", {})
    if b not in lat.get("float32", {}):
        return "–", "–"
    (f, f25, f75), (q, q25, q75) = lat["float32"][b], lat["int8"][b]
    return (
        f"{f:.2f} ({f25:.2f}–{f75:.2f}) / {q:.2f} ({q25:.2f}–{q75:.2f})",
        f"**{q / f:.2f}**",
    )


def report(rows: list[dict], seconds: float, command: str) -> str:
    import onnxruntime
    import torch

    from modelpress.advisor.calibrate import cpu_name

    slower = [
        f"{r['model']} (b{b} {q / f:.2f})"
        for r in rows
        for b in (1, 8)
        if b in r.get("latency", {}).get("float32", {})
        for f, q in [(r["latency"]["float32"][b][0], r["latency"]["int8"][b][0])]
        if q > f
    ]
    lines = [
        "# Quantization of full-size torchvision architectures (modelpress defaults)",
        "",
        f"Machine: {cpu_name()}, {platform.machine()}, 2 logical CPUs (shared), onnxruntime "
        f"{onnxruntime.__version__}, torch {torch.__version__}. `{command}`, "
        f"{time.strftime('%Y-%m-%d')}, {seconds:.0f} s.",
        "",
        "Random weights with BatchNorm statistics from synthetic images (no download), 3x224x224. "
        "CNNs `quantize(mode='static')`, ViT and Swin `quantize(mode='dynamic')`, 64 calibration "
        "images, all other options default. Cosine (of outputs centred on their mean) and SQNR "
        "(10·log10 of signal over int8 error energy): int8 against the optimized "
        "float32 model on 64 held-out synthetic images (not accuracy: the weights are untrained). "
        "Latency: ONNX Runtime CPU, all optimizations, interleaved, one global thread pool; "
        "median (p25–p75) ms; ratio = int8 / float32 (below 1: int8 faster).",
        "",
        "## Findings",
        "",
        f"- int8 slower than float32: {', '.join(slower) or 'none'}",
        "- failed: "
        + (", ".join(f"{r['model']} ({r['error']})" for r in rows if "error" in r) or "none"),
        "",
        "| model | params (M) | mode | layers int8 | cosine | SQNR dB | size int8/f32 | quantize s "
        "| b1 ms f32 / int8 | b1 ratio | b8 ms f32 / int8 | b8 ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | | {r['mode']} | failed: {r['error']} |||||||||")
            continue
        b1, b1r = _lat(r, 1)
        b8, b8r = _lat(r, 8)
        lines.append(
            f"| {r['model']} | {r['params_m']:.1f} | {r['mode']} | {r['layers']} | {r['cosine']:.4f} | "
            f"{r['sqnr_db']:.1f} | {r['size_ratio']:.2f}x | {r['quantize_s']:.1f} | {b1} | {b1r} | {b8} | {b8r} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=ALL, choices=ALL)
    ap.add_argument("--reps", type=int, default=50, help="timed runs per model at batch 1")
    args = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rows = []
    for name in args.models:
        row = run_case(name, args.reps)
        rows.append(row)
        ratio = {b: _lat(row, b)[1] for b in (1, 8)}
        print(
            f"{name}: {row['seconds']:.0f} s, cosine {row.get('cosine')}, ratios {ratio}"
            + (f", ERROR {row['error']}" if "error" in row else ""),
            flush=True,
        )
    command = "benchmarks/bench_quantize_torchvision.py"
    partial = args.models != ALL
    if partial:
        command += " --models " + " ".join(args.models)
    text = report(rows, time.perf_counter() - start, command)
    out = (WORK if partial else RESULTS) / "quantize_torchvision.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text + "\n")
    print(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
