"""The page ``bench_advisor.py`` writes (``results/advisor.md``): its layout and the reading of
the numbers, from the report it also saves as ``results/advisor.json`` (``--render`` rewrites
the page from that file alone)."""

from __future__ import annotations


def fmt(s: dict | None) -> str:
    if not s:
        return "no rows"
    return f"{s['rows']} rows, median error {s['median_abs_pct']:.1f}%, worst ratio {s['max_ratio']:.2f}x"


def _short_source(src: str) -> str:
    return src.split(" (")[0].replace("https://github.com/", "")


def _reading(rep: dict) -> list[str]:
    """What the numbers say, with the rows that miss the 1.5x bound named."""

    def misses(key):
        return [
            f"{x['row']} ({x[key]:.2f})"
            for x in rep["inference_rows"]
            if max(x[key], 1 / x[key]) > 1.5
        ]

    loo, lso = misses("ratio_held_out"), misses("ratio_held_out_source")
    return [
        "Reading the results:",
        "",
        f"- Rows over 1.5x, one GPU held out: {'; '.join(loo) or 'none'}. One source held out: "
        f"{'; '.join(lso) or 'none'}.",
        "- This round (issue 29's last row, BERT-Base INT8 at batch 1, sequence 128 on the A30: 0.66 "
        "held out): the engines launch different kernels, and the model launched the same ones on every "
        "card. TensorRT ships fused multi-head attention kernels (`plugin/bertQKVToContextPlugin`) for "
        "sm75 and later (Turing, Ampere, Ada, Hopper) and none for Volta's sm70: on a T4, A30 or A100 "
        "the scores, softmax and context run as one kernel with the probabilities on chip; on the V100 "
        "they are a batched GEMM, a softmax kernel and a batched GEMM. The model had folded the softmax "
        "into the scores GEMM everywhere, which no GEMM can do (a row reduction needs whole rows; an "
        "output tile holds part of one). Now (`advisor/launches.py`): the catalog's architecture says "
        "whether a compiled engine fuses attention; without it a softmax is a kernel of its own "
        "(BERT-Base: 111 kernels on the V100, 87 on Turing and later, 99 for every card before). And a "
        "kernel whose tiles fill part of the SMs draws part of the power, so a power-limited card "
        "sustains a higher clock at batch 1 (`advisor/clocks.py`: activity weighted by the busy share "
        "of the device): the T4 runs BERT-Large FP16 at sequence 384 at 93% of its batch-128 "
        "throughput at batch 1 (86.9 against 93.8 sequences/s), where the full-load clock at both "
        "said 70%. Inside the fused kernel the softmax runs on the vector units between the two "
        "products (timed at the vector rate, not hidden in the tensor rate). No factor per card, per "
        "release or per row; the three rules were written after seeing these rows.",
        "- Before -> after (same rows, refitted): inference held out by GPU median 9.7% worst 1.51x -> "
        "7.7% / 1.39x; held out by source 10.1% / 1.44x -> 8.6% / 1.39x; package defaults 9.6% / 1.42x -> "
        "6.9% / 1.36x; training fitted 10.1% / 1.42x -> 9.4% / 1.43x (held out by GPU 10.9% / 1.44x -> 10.9% / 1.45x). The A30 row held out by GPU: 0.66 -> 0.74 (0.78 held out by "
        "source); the V100's batch-1 rows were 1.08-1.33x too fast and are now 1.02-1.20.",
        "- What is left, and what got worse: 27 rows are further off held out by GPU, 43 closer. "
        "MLPerf ResNet-50 held out by GPU went from 4.2% / 1.30x to 5.9% / 1.39x: the refit lowered "
        "`clock_headroom` (1.458 -> 1.377), so the 72 W L4 at batch 1 is slower (0.77 -> 0.72) and "
        "the T4 at batch 1 faster (1.21 -> 1.25). Sequence-384 INT8 rows on Ampere are now too fast "
        "(A100: BERT-Base batch 128 1.10 -> 1.21, BERT-Large batch 1 1.26 -> 1.33; A30 batch 1 "
        "1.18): with the probabilities on chip the fused kernel is timed at the GEMM rate plus its "
        "softmax, and TensorRT 8.4's INT8 fMHA at 384 is slower than that. On the T4 (TensorRT "
        "7.2) INT8 at batch 1 barely beats FP16 (602 against 568 sequences/s, BERT-Base 128), the "
        "model gives it the 2x INT8 rate: INT8 1.29, FP16 0.88. The batch-1 sequence-128 rows on "
        "Ampere are still slow (0.74-0.84): the per-kernel cost is one number for every engine.",
        "- Previous round: at batch 1 small GEMMs run far below peak rather than wait on a fixed cost "
        "(`advisor/waves.py`): split-K cuts a deep reduction over a small output into slices that fill "
        "the device, a 64² tile runs at half an SM's tensor rate, the library takes the choice with the "
        "most work per unit of time; an embedding lookup reads the rows it gathers. Every demoBERT row "
        "ran the same way (CUDA graphs through `build/perf`, an engine per batch size, padded "
        "sequence).",
        "- Earlier rounds: MLPerf ResNet-50 was 10-13% slow on cards that hold their clock until `conv` "
        "was fitted (1.0 of the GEMM ceiling now); a kernel's fixed cost is counted in SM cycles, which "
        "is why a 2 GHz L4 beats a 1.4 GHz A100 at batch 1 (0.36 against 0.45 ms); eager PyTorch at "
        "batch 1 is host dispatch overlapped with the GPU, with one autocast cast per weighted op (why "
        "AMP is slower than FP32 there: 12.78 against 10.37 ms). Held out by source, NVIDIA's PyTorch "
        "tables get the host's cost per op from the training rows alone (about 72 us against 58), so "
        "their batch-1 rows come out near 0.8; the held-out fits start from the full fit's values.",
        "- The T4 row the issue named: NVIDIA's PyTorch ResNet-50 table gives 1,198 img/s (AMP, batch "
        "256), about a third of a compiled engine at the boost clock (3,259 predicted). Two causes: the "
        "table runs op by op (eager PyTorch), and a 70 W T4 sustains about half its boost clock. With "
        "both modelled the row is predicted within 10% (see the table); without the clock model the "
        "T4's TensorRT BERT rows come out 1.9-2.1x too fast (ablation below).",
        "- Honest caveats: `clock_headroom` and `kernel_overhead_us` are fitted on these inference rows "
        "too, so the package defaults are in-sample for them; the held-out columns are the fair test. "
        "The wave model's priors (64² tile at half rate, split-K slices of at least 256) were chosen "
        "after seeing these rows; quick refits with 0.4-0.65 and 128-512 put the held-out worst rows "
        "between 1.43x and 1.56x (last round, before fused attention).",
        "",
    ]


def markdown(rep: dict) -> str:
    f = rep["fitted"]
    s = rep["summary"]
    lines = [
        "# Hardware advisor: fit and error on published measurements",
        "",
        "Command: `.venv/bin/python benchmarks/bench_advisor.py` "
        f"(took {rep['seconds']} s on {rep['machine']}). Data: `src/modelpress/advisor/data/calibration_benchmarks.csv` "
        "(training, GEMM) and `src/modelpress/advisor/data/published_inference.csv` (inference), every row with its source.",
        "",
        "## Method",
        "",
        "Per-kernel roofline over the workload's kernels (max of compute and memory time plus a fixed "
        "per-kernel cost), with: the clock a card sustains at the pass's load (min(boost, headroom x base "
        "x activity^-1/3), base and boost clocks in the catalog with sources); activations that fit in the "
        "L2 cache kept on chip (the part of a kernel's input and output over the L2 size goes to DRAM); "
        "8-bit work at the 16-bit tensor rate on cards whose 8-bit units are slower (V100); FP32 "
        "convolutions on SIMT cores at SGEMM efficiency; a compiled kernel's fixed cost counted in SM "
        "clock cycles (`advisor/clocks.py`); eager inference as unfused kernels dispatched op by op by the "
        "host while the GPU runs (the pass takes the longer of the two), with autocast's weight casts below "
        "32 bits (`advisor/dispatch.py`). `gemm_ceiling` is the median achieved/peak of the NVIDIA BF16 "
        "GEMM rows; five factors are one least-squares fit in log space over the training and inference "
        "rows together; all other factors are physical priors (`advisor/efficiency.py`).",
        "",
        "Held out: **leave one GPU out** (each GPU's rows predicted by a fit that never saw that GPU) and "
        "**leave one source out** (each family of published inference rows predicted by a fit without it). "
        "Target: median error <= 15% and no miss over 1.5x on held-out inference rows: "
        + ("**met**." if rep["target_met"] else "**not met**."),
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
        *[f"- {k}: {fmt(v)}" for k, v in s.items()],
        "",
        "Held-out inference (leave one GPU out) by source family and by batch:",
        "",
        *[f"- {k}: {fmt(v)}" for k, v in rep["inference_by_source_family"].items()],
        *[f"- {k}: {fmt(v)}" for k, v in rep["inference_by_batch"].items()],
        "",
        *_reading(rep),
        "## Ablations (refitted without one mechanism; in-sample)",
        "",
        "| variant | training | inference | worst inference rows |",
        "| --- | --- | --- | --- |",
        *[
            f"| {k} | {fmt(v['training'])} | {fmt(v['inference'])} | "
            + "; ".join(f"{lab} {q:.2f}" for q, lab in v.get("worst", []))
            + " |"
            for k, v in rep["ablations"].items()
        ],
        "",
        "## Held-out inference rows",
        "",
        "Ratio = predicted / measured; `held out` is the leave-one-GPU-out prediction, `source out` the "
        "leave-one-source-out one, `defaults` the package's factors (fitted on every row).",
        "",
        "| row | measured | held out | ratio | source out | defaults | source |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *[
            f"| {x['row']} | {x['measured']:g} {x['unit']} | {x['predicted_held_out']:g} | {x['ratio_held_out']:.2f} | "
            f"{x['ratio_held_out_source']:.2f} | {x['ratio_defaults']:.2f} | {_short_source(x['source'])} |"
            for x in rep["inference_rows"]
        ],
        "",
        'GPU names the sources give loosely ("A100 (40GB)", "V100 (16GB)") resolve by the catalog\'s '
        "most-common-variant rule; the row keeps the note. Skipped: "
        + ("; ".join(rep["skipped"]) or "none")
        + ".",
        "",
        "## Training rows",
        "",
        "| row | batch | measured | fitted | held out |",
        "| --- | --- | --- | --- | --- |",
        *[
            f"| {r['row']} | {r['batch'] or 'max fit'} | {r['measured']:g} | {r['ratio_fitted']:.2f} | {r['ratio_held_out']:.2f} |"
            for r in rep["training_rows"]
        ],
        "",
        "## Service planner: queue analysis against a simulation",
        "",
        "ResNet-50 INT8 on a T4 (service times from the estimate), one replica, max batch 64; the "
        "analysis of `advisor/batching.py` against a discrete-event simulation of the same policy "
        "(100,000 Poisson requests, first 10% dropped).",
        "",
        "| requests/s | max delay ms | mean batch (analysis / simulated) | p99 ms (analysis / simulated) |",
        "| --- | --- | --- | --- |",
        *[
            f"| {p['rate']} | {p['max_delay_ms']:g} | {p['analysis_mean_batch']:.3f} / {p['simulated_mean_batch']:.3f} | "
            f"{p['analysis_p99_ms']:.3f} / {p['simulated_p99_ms']:.3f} |"
            for p in rep["planner_vs_simulation"]
        ],
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
