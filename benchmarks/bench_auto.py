"""``modelpress auto`` against what a user would try by hand, and against an exhaustive run.

For each model (the zoo's ResNet- and MobileNet-style digits CNNs, top-1 accuracy on the held-out
digits, budget 1 point; MiniLM, mean cosine similarity of the embeddings to the original's on 192
sentences, budget 0.01):

1. ``auto`` under a time budget (fresh cache): what it picks, whether the pick is within the
   accuracy budget, and how long the search took. With labels (the digits models) ``auto`` holds
   out half the samples (seeded, stratified by class; ``search.split``) to score every candidate
   and calibrates and trains (structured pruning with fine-tuning, QAT, distillation) on the rest;
2. with labels, the same search restricted to post-training candidates (``train=False``: the same
   split, the same time budget), the pick a search without training would make;
3. the same search with no time budget (the exhaustive run of the same space: every candidate,
   every refinement), continuing from the first run's cache (``--no-exhaustive`` skips it);
4. side by side, interleaved in one run (ONNX Runtime, one global thread pool, batch 1): the
   original, the single commands a user would try (``optimize`` then ``quantize`` with its
   defaults: static int8, minmax), the picks; each model's metric on the held-out samples (with
   labels the validation part of the split, which no candidate trained or calibrated on).

Models not run (``--models``) keep their rows from the previous ``auto.json``, marked as such.

Writes ``benchmarks/results/auto.md`` and ``auto.json``.

    .venv/bin/python benchmarks/bench_auto.py            # full run (an hour on a busy 2-core machine)
    .venv/bin/python benchmarks/bench_auto.py --quick    # smoke run
    .venv/bin/python benchmarks/bench_auto.py --models resnet-digits mobilenet-digits --no-exhaustive
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
    "resnet-digits": ("top1", 0.01, 240.0, 1.0, 20.0),
    "mobilenet-digits": ("top1", 0.01, 240.0, 1.0, 20.0),
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


def by_hand(model_path: Path, data: Path, calib_n: int | None, labels: str | None):
    """``modelpress optimize`` then ``modelpress quantize --data`` with the defaults."""
    from modelpress.compress.quantize import quantize
    from modelpress.ir import load
    from modelpress.passes import optimize

    fast = optimize(load(model_path)).model
    return fast, quantize(fast, data=str(data), labels_key=labels, limit=calib_n).model


def _search(path, data, labels, metric, budget, time_budget, timing, cache, **kw):
    from modelpress.search import auto

    t0 = time.perf_counter()
    result = auto(
        path,
        data=data,
        labels_key=labels,
        metric=metric,
        max_accuracy_drop=budget,
        time_budget_s=time_budget,
        timing_s=timing,
        cache_dir=cache,
        **kw,
    )
    return result, time.perf_counter() - t0


def _trials(result) -> list[dict]:
    return [
        {
            "label": t.label,
            "ratio": t.ratio,
            "drop": t.drop,
            "ok": t.ok,
            "cached": t.cached,
            "seconds": round(t.seconds, 1),
        }
        for t in result.trials
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", nargs="+", default=list(SETTINGS))
    ap.add_argument("--no-exhaustive", action="store_true", help="skip the unbudgeted run")
    args = ap.parse_args()
    settings = QUICK if args.quick else SETTINGS

    from modelpress import zoo
    from modelpress.ir import load
    from modelpress.ir.feeds import load_npz
    from modelpress.ir.files import write_npz
    from modelpress.runtime.measure import compare_latency
    from modelpress.runtime.ort import use_global_thread_pool
    from modelpress.search.engine import CALIBRATION_SAMPLES
    from modelpress.search.metric import Scorer, eval_data, runner
    from modelpress.search.split import holdout_split

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
        budgeted, search_s = _search(path, data, labels, metric, budget, time_budget, timing, cache)
        print(
            f"   picked {budgeted.winner.label} in {search_s:.0f} s ({budgeted.stopped})",
            flush=True,
        )
        post = None
        if labels:
            post_cache = WORK / f"{name}.post.cache"
            shutil.rmtree(post_cache, ignore_errors=True)
            post, post_s = _search(
                path, data, labels, metric, budget, time_budget, timing, post_cache, train=False
            )
            print(f"   post-training only: {post.winner.label} in {post_s:.0f} s", flush=True)
        full = None
        if not args.no_exhaustive:
            full, full_s = _search(path, data, labels, metric, budget, 1e9, timing, cache)
            print(
                f"   exhaustive: {len(full.trials)} trials, picked {full.winner.label} (+{full_s:.0f} s)",
                flush=True,
            )

        arrays = load_npz(data)
        original = load(path)
        names = [v.name for v in original.graph.inputs]
        n = min(arrays[k].shape[0] for k in names)
        split = holdout_split(arrays[labels]) if labels else None
        if split is not None:
            # the search's own split: score on the validation part, calibrate by hand on the rest
            train_part = WORK / f"{name}-train.npz"
            write_npz(train_part, {k: a[split.train] for k, a in arrays.items()})
            fast, int8 = by_hand(path, train_part, None, labels)
            scoring = {k: a[split.validation] for k, a in arrays.items()}
            scorer = Scorer(original, eval_data(scoring, names, labels_key=labels), metric)
        else:
            calib_n = max(1, min(CALIBRATION_SAMPLES, n // 4))
            fast, int8 = by_hand(path, data, calib_n, labels)
            scorer = Scorer(
                original, eval_data(arrays, names, labels_key=labels, start=calib_n), metric
            )
        variants = {
            "original": original,
            "optimize (defaults)": fast,
            "optimize + static int8 (defaults)": int8,
        }
        if post is not None:
            variants[f"auto, post-training only, {time_budget:.0f} s: {post.winner.label}"] = (
                post.model
            )
        pick_label = f"auto, {time_budget:.0f} s: {budgeted.winner.label}"
        variants[pick_label] = budgeted.model
        if full is not None:
            variants[f"exhaustive: {full.winner.label}"] = full.model

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
        by = {t["variant"]: t for t in table}
        hand, pick = by["optimize + static int8 (defaults)"], by[pick_label]
        row = {
            "model": name,
            "metric": metric,
            "budget": budget,
            "time_budget_s": time_budget,
            "search_s": search_s,
            "stopped": budgeted.stopped,
            "trials": len(budgeted.trials),
            "met": budgeted.met,
            "split": budgeted.split,
            "table": table,
            "pick_vs_hand": pick["median_ms"] / hand["median_ms"],
            "search_ratio_pick": budgeted.winner.ratio,
            "hand_within_budget": hand["drop"] <= budget,
            "pick_within_budget": pick["drop"] <= budget,
            "search_trials": _trials(budgeted),
        }
        if post is not None:
            p = table[3]
            row.update(
                {
                    "post_pick": post.winner.label,
                    "post_met": post.met,
                    "post_trials": len(post.trials),
                    "post_search_s": post_s,
                    "post_within_budget": p["drop"] <= budget,
                    "pick_vs_post": pick["median_ms"] / p["median_ms"],
                    "search_ratio_post": post.winner.ratio,
                    "trains": any(
                        k in t["label"]
                        for t in row["search_trials"]
                        for k in ("prune", "distill", "qat")
                    ),
                }
            )
        if full is not None:
            best = table[-1]
            row.update(
                {
                    "exhaustive_trials": len(full.trials),
                    "exhaustive_s": search_s + full_s,
                    "pick_vs_exhaustive": pick["median_ms"] / best["median_ms"],
                    "same_pick": budgeted.winner.key == full.winner.key,
                    "search_ratio_exhaustive": full.winner.ratio,
                }
            )
        rows.append(row)
        print(
            f"   pick {pick['median_ms']:.3g} ms vs by hand {hand['median_ms']:.3g} ms", flush=True
        )
    previous = _previous_rows({r["model"] for r in rows})
    write(rows + previous, time.time() - started, args.quick)


def _previous_rows(done: set[str]) -> list[dict]:
    """Rows of the models not run this time, from the last ``auto.json`` (marked as such)."""
    path = RESULTS / "auto.json"
    if not path.exists():
        return []
    old = json.loads(path.read_text())
    kept = []
    for r in old.get("rows", []):
        if r["model"] not in done:
            r.setdefault("carried", old.get("date") or "the previous run")
            kept.append(r)
    return kept


def write(rows: list[dict], seconds: float, quick: bool) -> None:
    import onnxruntime

    RESULTS.mkdir(parents=True, exist_ok=True)
    flags = _cpu_flags()
    lines = [
        "# auto: the search against the commands a user would try, a search without training, and an exhaustive run",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} logical CPUs (shared), {_cpu_name()}; CPU flags: {flags}; "
        f"onnxruntime {onnxruntime.__version__}. {dt.date.today()}, one run of `benchmarks/bench_auto.py"
        f"{' --quick' if quick else ''}`, {seconds:.0f} s.",
        "Latency: ONNX Runtime CPU, all graph optimizations, one global thread pool, batch 1, the "
        "models of a table interleaved in one run; median (p25–p75) in ms, ratio to the original in the same run. "
        "Metric on held-out samples: for the labelled digits models the validation half of `auto`'s split "
        "(seeded, stratified by class), which no candidate trained or calibrated on (calibration and training "
        "use the other half, and so does the by-hand int8); for MiniLM (no labels) the samples after the first "
        "ones, which calibrate; mean cosine similarity to the original's embeddings.",
        "",
    ]
    for r in rows:
        lines += [f"## {r['model']} ({r['metric']}, budget {r['budget']:g})", ""]
        if r.get("carried"):
            lines += [f"(Not run this time: the row of {r['carried']}.)", ""]
        if r.get("split"):
            sp = r["split"]
            lines += [
                f"Split: {sp['validation_samples']} validation / {sp['train_samples']} training samples "
                f"(fraction {sp['validation_fraction']:g}, seed {sp['seed']}, "
                f"{'stratified over ' + str(sp['classes']) + ' classes' if sp['stratified'] else 'random'}).",
                "",
            ]
        text = (
            f"auto with a {r['time_budget_s']:.0f} s budget: {r['trials']} trials in {r['search_s']:.0f} s "
            f"({r['stopped']}); {'within' if r['met'] else 'NOT within'} the accuracy budget."
        )
        if "post_pick" in r:
            text += (
                f" Post-training only (same split, same budget): {r['post_trials']} trials in "
                f"{r['post_search_s']:.0f} s, pick {r['post_pick']}."
            )
        if "exhaustive_trials" in r:
            text += (
                f" The exhaustive run of the same space: {r['exhaustive_trials']} trials, "
                f"{r['exhaustive_s']:.0f} s in all."
            )
        lines += [
            text,
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
        ]
        if "pick_vs_post" in r:
            lines.append(
                f"- the pick (training candidates in) against the post-training-only pick: "
                f"{r['pick_vs_post']:.2f}x its latency side by side; in the searches' own measurements "
                f"{r['search_ratio_pick']:.3f} vs {r['search_ratio_post']:.3f} of the original "
                f"(pick {'within' if r['pick_within_budget'] else 'over'} the budget on the validation part, "
                f"post-training pick {'within' if r['post_within_budget'] else 'over'})"
            )
        if "pick_vs_exhaustive" in r:
            lines.append(
                f"- the pick against the exhaustive run's pick: {r['pick_vs_exhaustive']:.2f}x its latency "
                f"({'the same candidate' if r['same_pick'] else 'a different candidate'}; in the searches' own "
                f"measurements {r['search_ratio_pick']:.3f} vs {r['search_ratio_exhaustive']:.3f} of the original)"
            )
        if r.get("search_trials"):
            tried = ", ".join(
                f"{t['label']} ({t['ratio']:.2f}x, drop {t['drop']:.3f})"
                if t["ok"] and t["ratio"] is not None
                else f"{t['label']} (failed)"
                for t in r["search_trials"][1:]
            )
            lines.append(
                f"- trials of the budgeted search, in order (ratio to the original, drop): {tried}"
            )
        lines.append("")
    (RESULTS / "auto.md").write_text("\n".join(lines))
    (RESULTS / "auto.json").write_text(
        json.dumps({"rows": rows, "seconds": seconds, "date": str(dt.date.today())}, indent=1)
    )
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
