"""Batch inference (`modelpress run`): does the pipeline keep up with its slower stage?

    .venv/bin/python benchmarks/bench_batch.py             # 2000 images, 8 rounds of 500 (~15 minutes)
    .venv/bin/python benchmarks/bench_batch.py --images 200 --per-round 100 --rounds 2   # a quick look

A folder of generated JPEG photos-like images (800x600, smooth gradients and shapes, so they
compress like photos) and a small CNN (3 strided convolutions, 224x224 input) that declares
deliberately costly pre-processing: decode, Lanczos resize of the shorter side to 256, centre
crop 224, normalise. For each number of pre-processing workers (1, and ``auto``: one per CPU):

* ``pre alone``: the worker pool preparing every batch, the model not run (items/s);
* ``model alone``: the model on ready batches of the same size back to back, in-process;
* ``pipeline``: ``run_batch`` end to end (journal, output file, worker start-up included), with
  the model's busy share and the time it waited for input.

The ratio that matters is pipeline / min(pre alone, model alone): the target is >= 85%. Variants
are interleaved round by round (a stage alone and the pipeline back to back on the same images)
and reported as median (min-max). Writes
``benchmarks/results/batch.md`` and ``batch.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from PIL import Image, ImageDraw

from modelpress.ir import from_proto, load, save
from modelpress.runtime.batch import run_batch
from modelpress.runtime.batch.sources import open_data
from modelpress.runtime.batch.stream import prepare_batch, resolve_workers, start_pool, stream
from modelpress.runtime.processing import Processing
from modelpress.runtime.session import Session

ROOT = Path(__file__).resolve().parent
WORK = ROOT / "_work" / "batch"
RESULTS = ROOT / "results"
PRE = "image:resize=256,crop=224,interp=lanczos,mean=0.485,0.456,0.406,std=0.229,0.224,0.225"
BATCH = 16


def make_images(folder: Path, n: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:600, 0:800].astype(np.float32)
    for i in range(n):
        path = folder / f"img{i:05d}.jpg"
        a, b, c = rng.uniform(0.002, 0.02, 3)
        if path.exists():  # made by an earlier run (the generator is seeded)
            continue
        base = np.stack(
            [np.sin(xx * a + i) * 80 + 120, np.cos(yy * b) * 80 + 120, (xx + yy) * c % 255], axis=2
        )
        img = Image.fromarray(base.clip(0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(img)
        for _ in range(6):
            x0, y0 = rng.integers(0, 700), rng.integers(0, 500)
            draw.ellipse(
                [x0, y0, x0 + rng.integers(20, 100), y0 + rng.integers(20, 100)],
                fill=tuple(int(v) for v in rng.integers(0, 255, 3)),
            )
        img.save(path, quality=88)


def make_model(path: Path) -> Path:
    rng = np.random.default_rng(0)
    inits, nodes, cin = [], [], 3
    src = "x"
    for i, cout in enumerate((16, 32, 64)):
        w = (rng.standard_normal((cout, cin, 3, 3)) * (2 / (9 * cin)) ** 0.5).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [
            helper.make_node("Conv", [src, f"w{i}"], [f"c{i}"], strides=[2, 2], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"]),
        ]
        src, cin = f"r{i}", cout
    inits.append(
        numpy_helper.from_array(rng.standard_normal((64, 10)).astype(np.float32) * 0.1, "fc")
    )
    nodes += [
        helper.make_node("GlobalAveragePool", [src], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["logits"]),
    ]
    g = helper.make_graph(
        nodes, "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        inits,
    )  # fmt: skip
    model = from_proto(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    )
    Processing.declare(model, pre=PRE, post="softmax,topk=5").store(model)
    return save(model, path)


def pre_alone(proc, source, workers: int) -> float:
    """Items/s of the worker pool preparing every batch; the model is not run. The pool is started
    before the clock starts, as ``run_batch`` starts it while the model loads."""
    batches = [
        [(i, source.ids[i], source.payloads[i]) for i in range(s, min(s + BATCH, len(source)))]
        for s in range(0, len(source), BATCH)
    ]
    pool = start_pool(proc, workers)
    time.sleep(0.5)  # about what loading the model gives the pool in run_batch
    timing = stream(
        batches,
        processing=proc,
        infer=lambda feeds: {},
        emit=lambda p, o: None,
        workers=workers,
        pool=pool,
    )
    return len(source) / timing.elapsed_s


def model_alone(sess, feeds, n: int) -> float:
    """Items/s of the model on ready batches, back to back."""
    sess.run(feeds, check=False)  # warm-up
    t0 = time.perf_counter()
    runs = -(-n // BATCH)
    for _ in range(runs):
        sess.run(feeds, check=False)
    return runs * BATCH / (time.perf_counter() - t0)


def pipeline(model, folder, out: Path, workers: int) -> dict:
    out.unlink(missing_ok=True)
    r = run_batch(model, folder, output=out, batch_size=BATCH, workers=workers, restart=True)
    return {
        "items_per_s": r.items_per_s,
        "busy": r.busy_fraction,
        "wait_s": r.wait_s,
        "elapsed_s": r.elapsed_s,
    }


def med(xs):
    return float(np.median(xs)), float(min(xs)), float(max(xs))


def subsets(folder: Path, images: int, size: int) -> list[Path]:
    """The folder's first ``images`` files in folders of ``size`` (hard links), one a round."""
    files = sorted(folder.glob("*.jpg"))[:images]
    parts = []
    for k in range(0, len(files) - size + 1, size):
        part = WORK / f"part{k // size}"
        part.mkdir(exist_ok=True)
        names = {f.name for f in files[k : k + size]}
        for f in part.glob("*.jpg"):
            if f.name not in names:
                f.unlink()
        for f in files[k : k + size]:
            if not (part / f.name).exists():
                os.link(f, part / f.name)
        parts.append(part)
    return parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument(
        "--per-round", type=int, default=500, help="images each variant runs in a round"
    )
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    folder = WORK / "images"
    make_images(folder, args.images)
    model_path = make_model(WORK / "cnn.onnx")
    cnn = load(model_path)
    proc = Processing.from_model(cnn)
    parts = subsets(folder, args.images, args.per_round)
    sess = Session(cnn, device="cpu")
    first = open_data(parts[0], kind="image")
    feeds = prepare_batch(
        [(i, first.ids[i], first.payloads[i]) for i in range(BATCH)], processing=proc
    ).feeds
    auto = resolve_workers("auto")
    counts = sorted({1, auto})
    # Start the worker machinery once (the forkserver imports the processing code), so that no
    # variant pays that one-time cost; each run still starts its own worker pool.
    warm = open_data(parts[0], kind="image")
    warm.ids, warm.payloads = warm.ids[:BATCH], warm.payloads[:BATCH]
    pre_alone(proc, warm, 1)
    load_before = os.getloadavg()
    rows: dict[str, list] = {}
    for r in range(args.rounds):
        part = parts[r % len(parts)]
        source = open_data(part, kind="image")
        rows.setdefault("model", []).append(model_alone(sess, feeds, len(source)))
        for w in counts:  # each pair back to back on the same images: their ratio is what we report
            pre = pre_alone(proc, source, w)
            pipe = pipeline(model_path, part, WORK / "predictions.jsonl", w)
            rows.setdefault(f"pre{w}", []).append(pre)
            rows.setdefault(f"pipe{w}", []).append(pipe)
            rows.setdefault(f"ratio{w}", []).append(
                pipe["items_per_s"] / min(pre, rows["model"][-1])
            )
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    load_after = os.getloadavg()
    model_rate = med(rows["model"])
    table = []
    for w in counts:
        pre = med(rows[f"pre{w}"])
        table.append({
            "workers": w, "auto": w == auto, "pre_alone": pre, "model_alone": model_rate,
            "pipeline": med([p["items_per_s"] for p in rows[f"pipe{w}"]]),
            "busy": med([p["busy"] for p in rows[f"pipe{w}"]]),
            "wait_s": med([p["wait_s"] for p in rows[f"pipe{w}"]]),
            "ratio": med(rows[f"ratio{w}"]),
            "slower": "pre-processing" if pre[0] < model_rate[0] else "model",
        })  # fmt: skip
    write(table, args, auto, (load_before[0], load_after[0]))


def write(table, args, auto, load) -> None:
    import onnxruntime
    import PIL

    RESULTS.mkdir(exist_ok=True)
    flags = _cpu_flags()
    fmt = lambda m: f"{m[0]:.1f} ({m[1]:.1f}-{m[2]:.1f})"  # noqa: E731
    lines = [
        "# Batch inference: pipeline against its slower stage",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores (shared with other jobs; `auto` = {auto} workers), "
        f"CPU flags: {flags}; onnxruntime {onnxruntime.__version__}, Pillow {PIL.__version__}, Python {platform.python_version()}. "
        f"Date: {time.strftime('%Y-%m-%d')}. No GPU: this task was not lent the device machine.",
        "",
        f"Command: `.venv/bin/python benchmarks/bench_batch.py --images {args.images} --per-round {args.per_round} --rounds {args.rounds}`",
        "",
        f"{args.images} generated 800x600 JPEGs; pre-processing `{PRE}` (deliberately costly: Lanczos "
        f"from 800x600); a 3-convolution CNN at 224x224 (~70 MFLOPs an image), batch {BATCH}. Each round "
        f"runs every variant on the same {args.per_round} images (the rounds go through the folder), the "
        "stage alone and the pipeline back to back; items/s, median (min-max) over "
        f"{args.rounds} rounds; the ratio is the median of the rounds' own ratios. `pipeline` is "
        "`run_batch` end to end: journal (fsync per batch) and the final output file included; its "
        "workers start while the model loads, and `pre alone` gives its pool the same head start. "
        f"Load average of the shared machine: {load[0]:.1f} before, {load[1]:.1f} after (2 cores).",
        "",
        "| workers | pre alone items/s | model alone items/s | pipeline items/s | pipeline / slower stage | model busy | waited for input s | slower stage |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in table:
        w = f"{row['workers']}{' (auto)' if row['auto'] else ''}"
        busy = row["busy"]
        lines.append(
            f"| {w} | {fmt(row['pre_alone'])} | {fmt(row['model_alone'])} | {fmt(row['pipeline'])} | "
            f"{100 * row['ratio'][0]:.0f}% ({100 * row['ratio'][1]:.0f}-{100 * row['ratio'][2]:.0f}%) | {100 * busy[0]:.0f}% ({100 * busy[1]:.0f}-{100 * busy[2]:.0f}%) | "
            f"{row['wait_s'][0]:.1f} | {row['slower']} |"
        )
    met = [row for row in table if row["ratio"][0] >= 0.85]
    ratios = ", ".join(f"{r['workers']} worker(s): {100 * r['ratio'][0]:.0f}%" for r in table)
    lines += [
        "",
        f"**Target** (pipeline >= 85% of its slower stage): {'met' if len(met) == len(table) else 'not met'} "
        f"({ratios}). "
        "With pre-processing the slower stage, the model is busy only the share of time its own work takes; "
        "on this machine both stages share the same cores, so the model's runs take CPU time from the workers "
        "(on a GPU they would not).",
    ]
    (RESULTS / "batch.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "batch.json").write_text(
        json.dumps(
            {
                "rows": table,
                "images": args.images,
                "per_round": args.per_round,
                "rounds": args.rounds,
                "load": load,
            },
            indent=2,
        )
        + "\n"
    )
    print("\n".join(lines))


def _cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    flags = set(
        next(
            (
                line.split(":", 1)[1].split()
                for line in text.splitlines()
                if line.startswith("flags")
            ),
            [],
        )
    )
    wanted = ["avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8"]
    return " ".join(f for f in wanted if f in flags) or "none of avx2/avx512"


if __name__ == "__main__":
    main()
