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
6. Held-out inference: ``published_inference.csv`` (TensorRT BERT on A100, TensorRT-LLM GPT-J /
   Llama-2-7B on H100, L40S, A100) predicted with the package's default factors; nothing is
   fitted to these rows.
7. Wave-quantisation ablation: steps 2 and 6 again with the catalog's SM counts removed (the
   estimator then skips the tile model), so the effect of that one model is reported.

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

from modelpress.advisor.catalog import Catalog, load_catalog
from modelpress.advisor.efficiency import DEFAULT_EFFICIENCY, Efficiency
from modelpress.advisor.published import (
    PublishedRow,
    load_published,
    load_published_inference,
    predict,
    predict_inference,
)
from modelpress.errors import ModelpressError

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

    inference = _heldout_inference(catalog)
    # ablation: the same fit and held-out check without SM counts (no wave quantisation)
    no_sm = Catalog(tuple(replace(g, sm_count=None) for g in catalog.gpus))
    fitted_no_sm = _fit(single, no_sm, base)
    no_sm_inf = _heldout_inference(no_sm)
    wave_ablation = {
        "with waves": {
            "fit_single_gpu": fit_stats,
            "heldout_inference": inference["all"],
            "heldout_encoder_batch_1": inference["encoder batch 1"],
            "eager": fitted.eager,
            "eager_overhead_us": fitted.eager_overhead_us,
        },
        "without waves": {
            "fit_single_gpu": _stats(
                [(predict(r, no_sm, fitted_no_sm), r.measured) for r in single]
            ),
            "heldout_inference": no_sm_inf["all"],
            "heldout_encoder_batch_1": no_sm_inf["encoder batch 1"],
            "eager": fitted_no_sm.eager,
            "eager_overhead_us": fitted_no_sm.eager_overhead_us,
        },
        "batch_1_rows_without_waves": [
            {"row": x["row"], "ratio": x["ratio"]} for x in no_sm_inf["rows"] if x["batch"] == 1
        ],
    }
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
        "heldout_inference": inference,
        "wave_ablation": wave_ablation,
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


def _heldout_inference(catalog) -> dict:
    """Predicted vs published single-GPU inference throughput, default factors, no fitting."""
    rows, skipped = [], []
    for r in load_published_inference(catalog):
        try:
            est = predict_inference(r, catalog, DEFAULT_EFFICIENCY)
        except ModelpressError as exc:  # e.g. a prompt + output longer than the model's context
            skipped.append(f"{r.label}: {exc}")
            continue
        rows.append(
            {
                "row": r.label,
                "unit": r.unit,
                "measured": round(r.measured, 1),
                "predicted": round(est.throughput, 1),
                "ratio": round(est.throughput / r.measured, 3),
                "bound": est.bound,
                "fits": est.fits,
                "batch": r.batch,
                "llm": bool(r.gen_tokens),
                "source": r.source,
            }
        )

    def stats(sel):
        pairs = [(x["predicted"], x["measured"]) for x in rows if sel(x)]
        return _stats(pairs) if pairs else None

    return {
        "all": stats(lambda x: True),
        "encoder batch >= 64": stats(lambda x: not x["llm"] and x["batch"] >= 64),
        "encoder batch 1": stats(lambda x: not x["llm"] and x["batch"] == 1),
        "LLM (prefill + decode)": stats(lambda x: x["llm"]),
        "rows": rows,
        "skipped": skipped,
    }


def _inference_markdown(inf: dict) -> list[str]:
    lines = [
        "## Held-out inference (published, never fitted)",
        "",
        "Rows: `src/modelpress/advisor/data/published_inference.csv`, every one with its source. Predicted "
        "with the package's default factors (the inference factors matmul 0.85, conv 0.70, attention 0.60, "
        "bandwidth 0.85, 3 µs per kernel are physical priors; none was changed for these rows). BERT rows are "
        "NVIDIA TensorRT demoBERT on an A100 40GB with inputs padded to the fixed sequence (sequences/s = "
        "batch / average latency); LLM rows are TensorRT-LLM output tokens/s per GPU at TP 1 (FP8 weights and "
        "KV cache on H100/L40S, FP16 on A100), modelled as a prefill of the prompt plus the decode steps.",
        "",
        *[f"- {k}: {_fmt(v)}" for k, v in inf.items() if k not in ("rows", "skipped") and v],
        "",
        "| row | measured | predicted | ratio | bound | fits | source |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *[
            f"| {x['row']} | {x['measured']:g} {x['unit']} | {x['predicted']:g} | {x['ratio']:.2f} | {x['bound']} | "
            f"{'yes' if x['fits'] else 'no'} | {x['source'].split(' ')[0].split('/blob/')[0].removeprefix('https://github.com/')} |"
            for x in inf["rows"]
        ],
        "",
        "Skipped: " + ("; ".join(inf["skipped"]) or "none") + ".",
        "",
        "Reading the table:",
        "",
        "- Large-batch rows (compute-bound encoders, memory-bound decode) are within the 25% target with the "
        "priors as they were; no inference factor was changed, so the error before and after this section is "
        "the same.",
        "- Batch 1 is the weak spot: a 384-token GEMM gives too few output tiles to fill the 108 SMs of an "
        "A100. The estimator now models this wave quantisation (see the ablation section below); it "
        "explains part of the gap, not all of it: batch-1 BERT-Large stays optimistic, INT8 most of all, "
        "so treat batch-1 GPU latency as a lower bound.",
        "- `fits: no` on four LLM rows that did run: the advisor reserves the whole KV cache of every sequence "
        "at its final length plus 10% slack; TensorRT-LLM's paged KV cache does not hold it all at once. "
        "The fit check is conservative there, the throughput is not affected.",
        "- GPT-J rows whose prompt + output exceed its 2048 positions are skipped (the advisor refuses them).",
        "",
        "Padding-free encoders (`--avg-seq L`, `get_workload(..., avg_seq=L)`): the published BERT rows above "
        "are padded, and the built-in `bert-base`/`bert-large` stay padded by default, because that is what a "
        "fixed-shape deployment runs and the mean real length is a property of the user's data. MLPerf "
        "Inference BERT-99 and TensorRT's varseqlen path skip the padding; to compare with them pass the "
        "dataset's mean token count as `--avg-seq`. Per-token work then scales by L/seq and attention by "
        "(L/seq)^2, throughput stays in sequences/s. No MLPerf row is in the held-out set: no per-GPU figure "
        "and dataset mean length could be sourced in this round.",
        "",
    ]
    return lines


def _wave_markdown(ab: dict) -> list[str]:
    return [
        "## Wave quantisation (ablation)",
        "",
        "A matrix-like kernel runs as output tiles, one per SM at a time; the last wave is partly empty, "
        "so the kernel gets tiles / (ceil(tiles / SMs) x SMs) of the device (tile 128x128 or 64x64, "
        "whichever fills more SMs; see `advisor/estimate.py`). SM counts are in the catalog with a source "
        "(`sm_count`, `src_sm`); the rows below rerun the eager-training fit and the held-out inference "
        "check with the SM counts removed.",
        "",
        "| | training fit (single GPU) | eager, overhead µs | held-out inference, all | held-out encoder batch 1 |",
        "| --- | --- | --- | --- | --- |",
        *[
            # "|error|" would split a table cell
            f"| {k} | {_fmt(v['fit_single_gpu']).replace('|', '')} | {v['eager']}, {v['eager_overhead_us']} | "
            f"{_fmt(v['heldout_inference']).replace('|', '')} | {_fmt(v['heldout_encoder_batch_1']).replace('|', '')} |"
            for k, v in ab.items()
            if k != "batch_1_rows_without_waves"
        ],
        "",
        "Batch-1 rows without waves: "
        + "; ".join(f"{x['row']} {x['ratio']:.2f}" for x in ab["batch_1_rows_without_waves"])
        + ". With waves: see the held-out table above.",
        "",
        "Honest reading: the tile model was first tried with 128x128 tiles only (the usual tensor-core "
        "tile); that over-corrected BERT-Base at batch 1 and sequence 128 (a 128-row output is one row of "
        "tiles: predicted 0.47x of the measurement) and left the median at 8.7% and the worst at 2.14x. "
        "Letting the library fall back to 64x64 tiles, as cuBLAS/TensorRT do for small outputs, gives the "
        "numbers above. That choice was made after seeing these rows, so they are no longer fully held out "
        "for it. BERT-Large INT8 at batch 1 stays about 2x too fast: with 64x64 tiles its products fill "
        "96 of 108 SMs, so the remaining gap is not wave quantisation (likely INT8 quantise/dequantise "
        "kernels, per-layer work outside the GEMMs, and lower per-SM efficiency of small tiles).",
        "",
    ]


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
        *_inference_markdown(rep["heldout_inference"]),
        *_wave_markdown(rep["wave_ablation"]),
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
