"""``modelpress auto`` against what a user would try by hand, and against an exhaustive run.

For each model (the zoo's ResNet- and MobileNet-style digits CNNs, top-1 accuracy on the held-out
digits, budget 1 point; MiniLM, mean cosine similarity of the embeddings to the original's on 192
sentences, budget 0.01):

1. ``auto`` under a time budget (fresh cache): what it picks, whether the pick is within the
   accuracy budget, and how long the search took;
2. the same search with no time budget (the exhaustive run of the same space: every candidate,
   every refinement), continuing from the first run's cache, whose trials are the same;
3. side by side, interleaved in one run (ONNX Runtime, one global thread pool, batch 1): the
   original, the single commands a user would try (``optimize`` then ``quantize`` with its
   defaults: static int8, minmax), the budgeted pick and the exhaustive run's pick; each
   model's metric on the held-out samples.

Writes ``benchmarks/results/auto.md`` and ``auto.json``.

    .venv/bin/python benchmarks/bench_auto.py            # full run (an hour on a busy 2-core machine)
    .venv/bin/python benchmarks/bench_auto.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import platform
import shutil
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
WORK = ROOT / "benchmarks" / "_work" / "bench_auto"

# model: (metric, budget, time budget s, timing s per trial, side-by-side timing s)
SETTINGS = {
    "resnet-digits": ("top1", 0.01, 120.0, 1.0, 20.0),
    "mobilenet-digits": ("top1", 0.01, 120.0, 1.0, 20.0),
    "minilm": ("cosine", 0.01, 300.0, 1.0, 40.0),
}
QUICK = {k: (m, b, 20.0, 0.2, 2.0) for k, (m, b, *_rest) in SETTINGS.items()}

SUBJECTS = (
    "The model",
    "A small network",
    "Our service",
    "The quantized graph",
    "This GPU",
    "The batch job",
)
VERBS = ("runs", "answers", "fails", "scales", "waits", "improves", "costs", "measures")
ENDINGS = (
    "on the CPU at night.",
    "faster than the original did last week.",
    "when the queue is full of long requests.",
    "with eight bits per weight and no loss.",
)


def sentences(n: int) -> list[str]:
    """``n`` distinct sentences built from templates (no data set is downloaded)."""
    combos = itertools.product(SUBJECTS, VERBS, ENDINGS)
    return [f"{s} {v} {e}" for s, v, e in itertools.islice(combos, n)]


def data_for(name: str, folder: Path) -> Path:
    from modelpress import zoo
    from modelpress.ir.files import write_npz

    path = folder / f"{name}-val.npz"
    if name == "minilm":
        from modelpress.zoo.minilm import tokenize

        write_npz(path, tokenize(sentences(192), 32))
    else:
        d = zoo.digits_data()
        write_npz(path, {"image": d.x_test, "y": d.y_test.astype(np.int64)})
    return path


def by_hand(model_path: Path, data: Path, calib_n: int, labels: str | None):
    """``modelpress optimize`` then ``modelpress quantize --data`` with the defaults."""
    from modelpress.compress.quantize import quantize
    from modelpress.ir import load
    from modelpress.passes import optimize

    fast = optimize(load(model_path)).model
    return fast, quantize(fast, data=str(data), labels_key=labels, limit=calib_n).model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", nargs="+", default=list(SETTINGS))
    args = ap.parse_args()
    settings = QUICK if args.quick else SETTINGS

    from modelpress import zoo
    from modelpress.ir import load
    from modelpress.ir.feeds import load_npz
    from modelpress.runtime.measure import compare_latency
    from modelpress.runtime.ort import use_global_thread_pool
    from modelpress.search import auto
    from modelpress.search.engine import CALIBRATION_SAMPLES
    from modelpress.search.metric import Scorer, eval_data

    use_global_thread_pool()
    WORK.mkdir(parents=True, exist_ok=True)
    started = time.time()
    rows = []
    for name in args.models:
        metric, budget, time_budget, timing, side = settings[name]
        path = zoo.build(name, WORK / f"{name}.onnx")
        data = data_for(name, WORK)
        labels = "y" if metric == "top1" else None
        cache = WORK / f"{name}.cache"
        shutil.rmtree(cache, ignore_errors=True)
        print(f"== {name}: auto, {time_budget:.0f} s budget", flush=True)
        t0 = time.perf_counter()
        budgeted = auto(
            path,
            data=data,
            labels_key=labels,
            metric=metric,
            max_accuracy_drop=budget,
            time_budget_s=time_budget,
            timing_s=timing,
            cache_dir=cache,
        )
        search_s = time.perf_counter() - t0
        print(
            f"   picked {budgeted.winner.label} in {search_s:.0f} s ({budgeted.stopped})",
            flush=True,
        )
        t0 = time.perf_counter()
        full = auto(
            path,
            data=data,
            labels_key=labels,
            metric=metric,
            max_accuracy_drop=budget,
            time_budget_s=1e9,
            timing_s=timing,
            cache_dir=cache,
        )
        full_s = time.perf_counter() - t0
        print(
            f"   exhaustive: {len(full.trials)} trials, picked {full.winner.label} (+{full_s:.0f} s)",
            flush=True,
        )

        arrays = load_npz(data)
        original = load(path)
        names = [v.name for v in original.graph.inputs]
        n = min(arrays[k].shape[0] for k in names)
        calib_n = max(1, min(CALIBRATION_SAMPLES, n // 4))
        fast, int8 = by_hand(path, data, calib_n, labels)
        scorer = Scorer(
            original, eval_data(arrays, names, labels_key=labels, start=calib_n), metric
        )
        variants = {
            "original": original,
            "optimize (defaults)": fast,
            "optimize + static int8 (defaults)": int8,
            f"auto, {time_budget:.0f} s: {budgeted.winner.label}": budgeted.model,
            f"exhaustive: {full.winner.label}": full.model,
        }
        from modelpress.search.metric import runner

        scores = {k: scorer.score(runner(m)) for k, m in variants.items()}
        feeds = {k: arrays[k][:1] for k in names}
        timings = compare_latency(list(variants.values()), feeds, budget_s=side, max_runs=1_000_000)
        base = timings[0].median_ms
        table = []
        for (label, _m), t in zip(variants.items(), timings):
            table.append(
                {
                    "variant": label,
                    "median_ms": t.median_ms,
                    "p25_ms": t.p25_ms,
                    "p75_ms": t.p75_ms,
                    "runs": t.runs,
                    "ratio": t.median_ms / base,
                    "score": scores[label],
                    "drop": scorer.reference_score - scores[label],
                }
            )
        hand, pick, best = table[2], table[3], table[4]
        rows.append(
            {
                "model": name,
                "metric": metric,
                "budget": budget,
                "time_budget_s": time_budget,
                "search_s": search_s,
                "stopped": budgeted.stopped,
                "trials": len(budgeted.trials),
                "met": budgeted.met,
                "exhaustive_trials": len(full.trials),
                "exhaustive_s": search_s + full_s,
                "table": table,
                "pick_vs_hand": pick["median_ms"] / hand["median_ms"],
                "pick_vs_exhaustive": pick["median_ms"] / best["median_ms"],
                "same_pick": budgeted.winner.key == full.winner.key,
                "search_ratio_pick": budgeted.winner.ratio,
                "search_ratio_exhaustive": full.winner.ratio,
                "hand_within_budget": hand["drop"] <= budget,
            }
        )
        print(
            f"   pick {pick['median_ms']:.3g} ms vs by hand {hand['median_ms']:.3g} ms vs exhaustive {best['median_ms']:.3g} ms",
            flush=True,
        )
    write(rows, time.time() - started, args.quick)


def write(rows: list[dict], seconds: float, quick: bool) -> None:
    import onnxruntime

    RESULTS.mkdir(parents=True, exist_ok=True)
    flags = _cpu_flags()
    lines = [
        "# auto: the search against the commands a user would try, and against an exhaustive run",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} logical CPUs (shared), {_cpu_name()}; CPU flags: {flags}; "
        f"onnxruntime {onnxruntime.__version__}. {dt.date.today()}, one run of `benchmarks/bench_auto.py"
        f"{' --quick' if quick else ''}`, {seconds:.0f} s.",
        "Latency: ONNX Runtime CPU, all graph optimizations, one global thread pool, batch 1, the five "
        "models of a table interleaved in one run; median (p25–p75) in ms, ratio to the original in the same run. "
        "Metric on the held-out samples (the first ones calibrate): top-1 accuracy on digits, mean cosine "
        "similarity to the original's embeddings for MiniLM.",
        "",
    ]
    for r in rows:
        lines += [
            f"## {r['model']} ({r['metric']}, budget {r['budget']:g})",
            "",
            f"auto with a {r['time_budget_s']:.0f} s budget: {r['trials']} trials in {r['search_s']:.0f} s "
            f"({r['stopped']}); {'within' if r['met'] else 'NOT within'} the accuracy budget. The exhaustive run of "
            f"the same space: {r['exhaustive_trials']} trials, {r['exhaustive_s']:.0f} s in all.",
            "",
            "| variant | median ms (p25–p75) | vs original | metric | drop |",
            "|---|---|---|---|---|",
        ]
        for t in r["table"]:
            lines.append(
                f"| {t['variant']} | {t['median_ms']:.3f} ({t['p25_ms']:.3f}–{t['p75_ms']:.3f}) | {t['ratio']:.2f} | "
                f"{t['score']:.4f} | {t['drop']:.4f} |"
            )
        lines += [
            "",
            f"- the pick against optimize + static int8 by hand: {r['pick_vs_hand']:.2f}x its latency "
            f"(by hand {'within' if r['hand_within_budget'] else 'over'} the budget)",
            f"- the pick against the exhaustive run's pick: {r['pick_vs_exhaustive']:.2f}x its latency "
            f"({'the same candidate' if r['same_pick'] else 'a different candidate'}; in the searches' own "
            f"measurements {r['search_ratio_pick']:.3f} vs {r['search_ratio_exhaustive']:.3f} of the original)",
            "",
        ]
    (RESULTS / "auto.md").write_text("\n".join(lines))
    (RESULTS / "auto.json").write_text(json.dumps({"rows": rows, "seconds": seconds}, indent=1))
    print(f"wrote {RESULTS / 'auto.md'}")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "?"
    flags = set(
        next(
            (ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []
        )
    )
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")
    return ", ".join(f for f in wanted if f in flags) or "none of avx2/avx512/vnni/amx"


if __name__ == "__main__":
    main()
