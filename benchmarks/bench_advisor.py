"""Fit and check the hardware advisor's efficiency factors against published measurements.

    .venv/bin/python benchmarks/bench_advisor.py            # fit, report, CPU calibration
    .venv/bin/python benchmarks/bench_advisor.py --no-cpu   # skip the local CPU measurement

Method:
1. GEMM ceiling: the median achieved/dense-peak of the NVIDIA BF16 GEMM microbenchmarks in
   ``calibration_benchmarks.csv``.
2. Eager-training factors (``eager``, ``eager_overhead_us``): least squares on
   log(predicted / measured) over the single-GPU training rows (ResNet-50 and BERT-Large on 12
   GPUs, AMP FP16 and TF32). Two parameters for 34 rows.
3. Generalisation: leave-one-GPU-out (fit without every row of a GPU, predict that GPU) and
   hold-out by model (fit on ResNet-50, predict BERT-Large, and back).
4. Multi-GPU rows are predicted, not fitted.
5. This CPU: ``advise --calibrate``'s measurement on zoo models (predicted vs measured ms).

Writes ``benchmarks/results/advisor.md`` and ``advisor.json``. The fitted values are copied by
hand into ``src/modelpress/advisor/efficiency.py``; the script says when they differ.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from modelpress.advisor.catalog import load_catalog
from modelpress.advisor.efficiency import DEFAULT_EFFICIENCY, Efficiency
from modelpress.advisor.published import PublishedRow, load_published, predict

RESULTS = Path(__file__).parent / "results"
FITTED = ("eager", "eager_overhead_us")
START = (0.6, 10.0)
BOUNDS = ((0.05, 0.0), (1.5, 300.0))


def _fit(rows: list[PublishedRow], catalog, base: Efficiency) -> Efficiency:
    def residuals(x):
        eff = replace(base, **dict(zip(FITTED, x, strict=True)))
        return [np.log(predict(r, catalog, eff) / r.measured) for r in rows]

    sol = least_squares(residuals, START, bounds=BOUNDS, x_scale=(0.1, 10.0))
    return replace(base, **{k: round(float(v), 3) for k, v in zip(FITTED, sol.x, strict=True)})


def _stats(pairs: list[tuple[float, float]]) -> dict:
    ratios = [p / m for p, m in pairs]
    return {
        "rows": len(ratios),
        "median_abs_pct": 100 * statistics.median(abs(r - 1) for r in ratios),
        "max_ratio": max(max(r, 1 / r) for r in ratios),
    }


def _label(r: PublishedRow) -> str:
    return f"{r.model} {r.precision} x{r.num_gpus} on {r.gpu}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-cpu", action="store_true", help="skip the local CPU calibration")
    args = ap.parse_args()
    t0 = time.time()
    catalog = load_catalog()
    rows, skipped = load_published(catalog)
    gemm = [r for r in rows if r.model == "gemm"]
    single = [r for r in rows if r.model != "gemm" and r.num_gpus == 1]
    multi = [r for r in rows if r.model != "gemm" and r.num_gpus > 1]

    nvidia_bf16 = [
        r for r in gemm if r.precision == "bf16" and catalog.find(r.gpu).vendor == "NVIDIA"
    ]
    ceiling = statistics.median(r.measured / catalog.find(r.gpu).bf16_tflops for r in nvidia_bf16)
    base = replace(DEFAULT_EFFICIENCY, gemm_ceiling=round(ceiling, 3))
    fitted = _fit(single, catalog, base)
    print("fitted:", {k: getattr(fitted, k) for k in ("gemm_ceiling", *FITTED)}, file=sys.stderr)

    per_row = [(r, predict(r, catalog, fitted)) for r in rows]
    fit_stats = _stats([(p, r.measured) for r, p in per_row if r in single])

    # leave one GPU out: every row of a GPU is predicted by a fit that never saw that GPU
    loo_pairs = []
    for gpu in sorted({r.gpu for r in single}):
        eff = _fit([r for r in single if r.gpu != gpu], catalog, base)
        loo_pairs += [(predict(r, catalog, eff), r.measured) for r in single if r.gpu == gpu]
        print(f"  left out {gpu}", file=sys.stderr)
    loo_stats = _stats(loo_pairs)
    holdout = {}
    for train_on, test_on in (("resnet50", "bert-large"), ("bert-large", "resnet50")):
        eff = _fit([r for r in single if r.model == train_on], catalog, base)
        holdout[f"fit {train_on}, predict {test_on}"] = _stats(
            [(predict(r, catalog, eff), r.measured) for r in single if r.model == test_on]
        )
    multi_stats = _stats([(p, r.measured) for r, p in per_row if r in multi])
    gemm_stats = _stats([(p, r.measured) for r, p in per_row if r in gemm])

    cpu = [] if args.no_cpu else _cpu_calibration()
    defaults_match = all(
        abs(getattr(fitted, k) - getattr(DEFAULT_EFFICIENCY, k))
        <= 0.02 * max(abs(getattr(fitted, k)), 1e-9)
        for k in ("gemm_ceiling", *FITTED)
    )

    RESULTS.mkdir(exist_ok=True)
    report = {
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
        "fitted": fitted.to_dict(),
        "package_defaults_match_fit": defaults_match,
        "fit_single_gpu": fit_stats,
        "leave_one_gpu_out": loo_stats,
        "holdout_by_model": holdout,
        "multi_gpu_predicted": multi_stats,
        "gemm_rows": gemm_stats,
        "rows": [
            {
                "row": _label(r),
                "batch": r.batch,
                "measured": r.measured,
                "predicted": round(p, 2),
                "ratio": round(p / r.measured, 3),
            }
            for r, p in per_row
        ],
        "skipped": skipped,
        "cpu_calibration": cpu,
        "seconds": round(time.time() - t0, 1),
    }
    (RESULTS / "advisor.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS / "advisor.md").write_text(_markdown(report))
    print((RESULTS / "advisor.md").read_text())
    if not defaults_match:
        print(
            "warning: the package defaults in advisor/efficiency.py differ from this fit by more than 2%",
            file=sys.stderr,
        )
    return 0


def _cpu_calibration() -> list[dict]:
    """Predicted vs measured on this CPU for zoo models (the same code as ``advise --calibrate``)."""
    import tempfile

    from modelpress.advisor.calibrate import calibrate_cpu
    from modelpress.ir import load
    from modelpress.profile.workload import workload_from_onnx
    from modelpress.zoo import build

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, batch, seq in (("minilm", 8, 128), ("bert-tiny", 8, 128)):
            try:
                path = build(name, Path(tmp) / f"{name}.onnx")
            except Exception as exc:  # a zoo model needing an extra that is absent: report, go on
                out.append({"model": name, "error": str(exc).splitlines()[0]})
                continue
            model = load(path)
            w = workload_from_onnx(model, name=name, seq=seq)
            cal = calibrate_cpu(w, model=model, batch=batch, seq=seq, runs=15)
            out.append({"model": name, "batch": batch, "seq": seq, **cal.to_dict()})
    return out


def _fmt(s: dict) -> str:
    return f"{s['rows']} rows, median |error| {s['median_abs_pct']:.1f}%, worst ratio {s['max_ratio']:.2f}x"


def _markdown(rep: dict) -> str:
    f = rep["fitted"]
    lines = [
        "# Hardware advisor: fit and error on published measurements",
        "",
        "Command: `.venv/bin/python benchmarks/bench_advisor.py` "
        f"(took {rep['seconds']} s on {rep['machine']}). Data: `src/modelpress/advisor/data/calibration_benchmarks.csv` "
        "(a copy of the shared calibration file).",
        "",
        "## Method",
        "",
        "Per-kernel roofline (max of compute and memory time plus a per-kernel overhead) over the workload's "
        "kernels, built from the architecture (ResNet-50 v1.5 at 224², BERT-Large at sequence 384). Training is "
        "forward + 2x backward + the optimizer step, unfused (eager). `gemm_ceiling` is the median achieved/peak of "
        "the NVIDIA BF16 GEMM rows; the two eager-training factors are a least-squares fit in log space to the "
        "single-GPU training rows; all other factors are fixed physical priors (see `advisor/efficiency.py`). "
        "Rows without a batch size run at the largest batch that fits, at most 256.",
        "",
        "## Fitted factors",
        "",
        "| factor | value |",
        "| --- | --- |",
        *[f"| {k} | {v} |" for k, v in f.items()],
        "",
        f"Package defaults match this fit: {'yes' if rep['package_defaults_match_fit'] else 'NO'}.",
        "",
        "## Error",
        "",
        f"- fit, single-GPU training: {_fmt(rep['fit_single_gpu'])}",
        f"- leave-one-GPU-out (each GPU predicted by a fit that never saw it): {_fmt(rep['leave_one_gpu_out'])}",
        *[f"- hold-out, {k}: {_fmt(v)}" for k, v in rep["holdout_by_model"].items()],
        f"- multi-GPU rows (predicted, not fitted): {_fmt(rep['multi_gpu_predicted'])}",
        f"- GEMM rows (peak x gemm_ceiling): {_fmt(rep['gemm_rows'])}",
        "",
        "## Per row (fitted factors)",
        "",
        "| row | batch | measured | predicted | ratio |",
        "| --- | --- | --- | --- | --- |",
        *[
            f"| {r['row']} | {r['batch'] or 'max fit'} | {r['measured']:g} | {r['predicted']:g} | {r['ratio']:.2f} |"
            for r in rep["rows"]
        ],
        "",
        "Skipped rows: " + ("; ".join(rep["skipped"]) or "none") + ".",
        "",
    ]
    if rep["cpu_calibration"]:
        lines += [
            "## This CPU (`advise --calibrate`)",
            "",
            "| model | batch | matmul GFLOP/s | copy GB/s | µs per node | predicted ms | measured ms (p25-p75) | ratio |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for c in rep["cpu_calibration"]:
            if "error" in c:
                lines.append(f"| {c['model']} | - | - | - | - | - | {c['error']} | - |")
                continue
            lines.append(
                f"| {c['model']} seq {c['seq']} | {c['batch']} | {c['matmul_gflops']:.1f} | {c['copy_gbs']:.1f} | {c['node_overhead_us']:.2f} | {c['predicted_ms']:.2f} | "
                f"{c['measured_ms']:.2f} ({c['measured_p25_ms']:.2f}-{c['measured_p75_ms']:.2f}) | {c['predicted_over_measured']:.2f} |"
            )
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
