"""Compression with training: pruning, Deep Compression, QAT and distillation, against peers.

    .venv/bin/python benchmarks/bench_train.py                   # everything (about half an hour on a quiet 2-core machine)
    .venv/bin/python benchmarks/bench_train.py --only prune,qat   # some sections

Sections (each writes its rows into ``benchmarks/results/train.json`` as it finishes; the page
``train.md`` is written from that file, so sections may run separately):

* ``prune``: resnet-digits and mobilenet-digits (``modelpress.zoo``), 50% of the channels of every
  group, modelpress on the ONNX file with labels and without (the original as teacher), and
  Torch-Pruning 1.6.1 (group L1 magnitude, DepGraph) on the PyTorch source of the same network,
  fine-tuned for the same epochs with the same optimizer and learning rate (in train mode, as its
  users do); test accuracy right after pruning (BatchNorm statistics measured again, no training) and on the digits test split (median of 3 seeds, and each), parameters,
  size, ONNX Runtime CPU latency at batch 1 and 8 (all variants in one process, interleaved, one
  thread);
* ``deep``: Deep Compression at 5 bits, 90% sparsity (mobilenet-digits: 80% and 90%), 4 epochs
  for each retraining (Adam 1e-2, codebooks 1e-3): size after each stage, the bytes of each part of the ``.mpz``, and test
  accuracy of the model decoded from it;
* ``qat``: post-training static int8 and w4a8 (4-bit weights rounded to nearest on static mode's
  graph) against QAT of each, same calibration/training data;
* ``distill``: 0.5-width students of resnet-digits and mobilenet-digits, distilled with ``distill``'s defaults (labels +
  teacher at T=4, alpha 0.5, + the CNN's stage outputs) and trained on labels alone for the same
  steps, optimizer, learning rate, data and seed: made from the teacher by width reduction (3 and
  10 epochs) and the same graph with random weights given as a file (10 epochs); from the zoo's
  teacher and from the same teacher trained 16 epochs more; mobilenet-digits likewise (10 epochs);
  10 paired seeds, mean ± std and the paired difference;
* ``minilm``: all-MiniLM-L6-v2, half of the FFN neurons and a third of the heads pruned (chosen
  by weight norms and on the data a ratio per layer, for reference; then on the data across all
  layers, with a least-squares refit of the layers that read them), then distilled (outputs and
  hidden states) on 6,800 sentences from the docstrings of Python's standard library;
  mean cosine of the sentence embeddings to the original on held-out sentences after each step,
  latency at batch 1 and 8.
"""

from __future__ import annotations

import argparse
import inspect
import io
import json
import platform
import re
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from modelpress import zoo
from modelpress.compress.prune.api import param_count, prune
from modelpress.compress.train import TrainConfig
from modelpress.ir import from_proto, load
from modelpress.ir.io import model_bytes
from modelpress.runtime.measure import time_interleaved
from modelpress.runtime.ort import session, session_options, use_global_thread_pool
from modelpress.verify import run_model

ROOT = Path(__file__).resolve().parent
WORK = ROOT / "_work"
RESULTS = ROOT / "results"
JSON = RESULTS / "train.json"
CNNS = ("resnet-digits", "mobilenet-digits")
EPOCHS, LR = 3, 3e-3
DEEP_LR = 1e-2  # Deep Compression's pruning retraining (its codebook retraining: a tenth of it)
MINILM_IMPORTANCE = "obs"


def _load_results() -> dict:
    return json.loads(JSON.read_text()) if JSON.exists() else {}


def _save(section: str, rows) -> None:
    data = _load_results()
    data[section] = rows
    data["machine"] = (
        f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}, Python {platform.python_version()}"
    )
    data.setdefault("dates", {})[section] = time.strftime("%Y-%m-%d")
    JSON.write_text(json.dumps(data, indent=1))


def _digits():
    d = zoo.digits_data()
    return d, {"image": d.x_train, "y": d.y_train}


def _accuracy(model, d) -> float:
    out = run_model(model, {"image": d.x_test}, optimize="all")
    return float((next(iter(out.values())).argmax(1) == d.y_test).mean())


def _latency(models: dict, feeds_by_batch: dict, rounds: int = 40) -> dict:
    out = {}
    for batch, feeds in feeds_by_batch.items():
        names = list(models)
        runs = []
        for n in names:
            so = session_options()
            sess = session(models[n], options=so)
            runs.append(lambda s=sess, f=feeds: s.run(None, f))
        timings = time_interleaved(runs, runs=rounds, warmup=5)
        for n, t in zip(names, timings):
            out.setdefault(n, {})[batch] = {"median": t.median_ms, "p25": t.p25_ms, "p75": t.p75_ms}
    return out


def _size(model) -> int:
    return len(model_bytes(model))


# ---------------------------------------------------------------------------------------------
def _torch_pruning(name: str, d, seed: int = 0) -> tuple[object, float]:
    import torch_pruning as tp

    torch.manual_seed(seed)
    module, (example,) = zoo.build_torch(name)
    imp = tp.importance.MagnitudeImportance(p=1)  # group L1, as modelpress's default
    pruner_cls = getattr(tp.pruner, "MetaPruner", None) or tp.pruner.BasePruner
    pruner = pruner_cls(
        module, example, importance=imp, pruning_ratio=0.5, ignored_layers=[module.head]
    )
    pruner.step()
    started = time.perf_counter()
    x, y = torch.from_numpy(d.x_train), torch.from_numpy(d.y_train)
    # the same budget as modelpress: EPOCHS passes, Adam, cosine after a 5% warm-up, batch 32
    opt = torch.optim.Adam(module.parameters(), lr=LR)
    steps = EPOCHS * -(-len(x) // 32)
    warm = int(0.05 * steps)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            (s + 1) / warm
            if s < warm
            else 0.5 * (1 + np.cos(np.pi * (s - warm) / max(1, steps - warm)))
        ),
    )
    gen = torch.Generator().manual_seed(seed)
    module.train()
    for _ in range(EPOCHS):
        order = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), 32):
            idx = order[i : i + 32]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(module(x[idx]), y[idx]).backward()
            opt.step()
            sched.step()
    module.eval()
    seconds = time.perf_counter() - started
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (example,),
            buf,
            dynamo=False,
            input_names=["image"],
            output_names=["logits"],
            dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
            opset_version=17,
        )
    import onnx

    return from_proto(onnx.load_from_string(buf.getvalue())), seconds


def _torch_pruning_selected(name: str, d, batches: int = 8, batch_size: int = 64) -> float:
    """Test accuracy of Torch-Pruning's selection before any training, its BatchNorm statistics
    measured again on the first ``batches`` shuffled training batches (as modelpress does)."""
    import torch_pruning as tp

    torch.manual_seed(0)
    module, (example,) = zoo.build_torch(name)
    tp.pruner.MetaPruner(
        module,
        example,
        importance=tp.importance.MagnitudeImportance(p=1),
        pruning_ratio=0.5,
        ignored_layers=[module.head],
    ).step()
    norms = [m for m in module.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a plain average over the batches
    order = np.random.default_rng(0).permutation(len(d.x_train))
    module.train()
    with torch.no_grad():
        for k in range(batches):
            module(torch.from_numpy(d.x_train[order[k * batch_size : (k + 1) * batch_size]]))
        module.eval()
        return float((module(torch.from_numpy(d.x_test)).argmax(1).numpy() == d.y_test).mean())


SEEDS = (0, 1, 2)


def bench_prune() -> list[dict]:
    d, data = _digits()
    rows = []
    for name in CNNS:
        original = load(zoo.build(name, WORK / f"{name}.onnx"))
        makers = {
            "modelpress, labels": lambda seed, original=original: (
                prune(
                    original,
                    data=data,
                    labels_key="y",
                    ratio=0.5,
                    train=TrainConfig(epochs=EPOCHS, lr=LR, seed=seed),
                ).model
            ),
            "modelpress, no labels (teacher)": lambda seed, original=original: (
                prune(
                    original,
                    data={"image": d.x_train},
                    ratio=0.5,
                    train=TrainConfig(epochs=EPOCHS, lr=LR, seed=seed),
                ).model
            ),
            "Torch-Pruning (PyTorch source), labels": lambda seed, name=name: _torch_pruning(
                name, d, seed
            )[0],
        }
        # the selection alone: accuracy right after pruning, before any fine-tuning
        selected = {
            "modelpress, labels": _accuracy(
                prune(original, data=data, labels_key="y", ratio=0.5, train=False).model, d
            ),
            "modelpress, no labels (teacher)": _accuracy(
                prune(original, data={"image": d.x_train}, ratio=0.5, train=False).model, d
            ),
            "Torch-Pruning (PyTorch source), labels": _torch_pruning_selected(name, d),
        }
        variants = {"original": ([original], [_accuracy(original, d)], None)}
        for label, make in makers.items():
            models, accs = [], []
            t = time.perf_counter()
            for seed in SEEDS:
                models.append(make(seed))
                accs.append(_accuracy(models[-1], d))
            variants[label] = (models, accs, (time.perf_counter() - t) / len(SEEDS))
        feeds = {
            b: {"image": np.ascontiguousarray(np.resize(d.x_test, (b, 1, 32, 32)))} for b in (1, 8)
        }
        lat = _latency({k: v[0][0] for k, v in variants.items()}, feeds)
        for k, (models, accs, secs) in variants.items():
            rows.append(
                {
                    "model": name,
                    "variant": k,
                    "accuracy": float(np.median(accs)),
                    "accuracies": accs,
                    "params": param_count(models[0]),
                    "size": _size(models[0]),
                    "latency": lat[k],
                    "seconds": secs,
                    "before_training": selected.get(k),
                }
            )
            print(rows[-1], flush=True)
    return rows


def bench_deep() -> list[dict]:
    from modelpress.compress.deep import deep_compress, open_mpz

    d, data = _digits()
    rows = []
    # At the other sections' 3e-3, mobilenet-digits recovered from 80% pruning to only 96.4%; at
    # the zoo's own training rate, 1e-2, it recovers fully. 90% is more than its 20k weights allow.
    for name, sparsity in (
        ("resnet-digits", 0.9),
        ("mobilenet-digits", 0.8),
        ("mobilenet-digits", 0.9),
    ):
        original = load(zoo.build(name, WORK / f"{name}.onnx"))
        t = time.perf_counter()
        r = deep_compress(
            original,
            data=data,
            labels_key="y",
            sparsity=sparsity,
            bits=5,
            train=TrainConfig(epochs=4, lr=DEEP_LR),
        )
        path = WORK / f"{name}.mpz"
        path.write_bytes(r.data)
        rows.append(
            {
                "model": name,
                "accuracy_before": _accuracy(original, d),
                "accuracy_after": _accuracy(open_mpz(path), d),
                "stages": r.stages,
                "parts": r.parts,
                "seconds": time.perf_counter() - t,
                "sparsity": r.sparsity,
            }
        )
        print(rows[-1], flush=True)
    return rows


def bench_qat() -> list[dict]:
    from modelpress.compress.qat.fakequant import TrainingGraph
    from modelpress.compress.quantize import quantize

    d, _ = _digits()
    rng = np.random.default_rng(0)
    idx = rng.permutation(len(d.x_train))[:512]
    cal = [
        {"image": d.x_train[idx[i : i + 32]], "y": d.y_train[idx[i : i + 32]]}
        for i in range(0, 512, 32)
    ]
    rows = []
    for name in CNNS:
        original = load(zoo.build(name, WORK / f"{name}.onnx"))
        row = {"model": name, "float": _accuracy(original, d)}
        ptq = quantize(original, mode="static", data=cal, labels_key="y")
        row["static int8"] = _accuracy(ptq.model, d)
        # w4a8 after training: 4-bit weights rounded to nearest on static mode's graph
        plain = quantize(
            original,
            mode="static",
            data=cal,
            labels_key="y",
            gptq=False,
            bias_correction=False,
        )
        tg = TrainingGraph(plain.model, bits=4)
        row["w4a8 (round to nearest)"] = _accuracy(tg.export(tg.module()), d)
        t = time.perf_counter()
        q8 = quantize(
            original,
            mode="qat",
            data=cal,
            labels_key="y",
            train=TrainConfig(epochs=1, lr=1e-4),
        )
        row["QAT int8"] = _accuracy(q8.model, d)
        q4 = quantize(
            original,
            mode="qat",
            data=cal,
            labels_key="y",
            bits=4,
            train=TrainConfig(epochs=2, lr=3e-4),
        )
        row["QAT w4a8"] = _accuracy(q4.model, d)
        row["seconds"] = time.perf_counter() - t
        row["same_structure"] = [n.op_type for n in q8.model.graph] == [
            n.op_type for n in plain.model.graph
        ]
        rows.append(row)
        print(row, flush=True)
    return rows


DISTILL_SEEDS = tuple(range(10))
# (teacher, its training, student, epochs, variant, distill options): the same student, steps, optimizer, learning
# rate, data and seed for every variant of a student; alpha 0 is the labels alone (no teacher)
LABELS_ONLY = {"alpha": 0.0, "features": "none"}
DISTILL_RUNS = (
    ("resnet-digits", "zoo", "width", 3, "labels only", LABELS_ONLY),
    ("resnet-digits", "zoo", "width", 3, "distilled", {}),
    ("resnet-digits", "zoo", "width", 10, "labels only", LABELS_ONLY),
    (
        "resnet-digits",
        "zoo",
        "width",
        10,
        "distilled, outputs only (no features)",
        {"features": "none"},
    ),
    ("resnet-digits", "zoo", "width", 10, "distilled", {}),
    ("resnet-digits", "zoo", "fresh", 10, "labels only", LABELS_ONLY),
    ("resnet-digits", "zoo", "fresh", 10, "distilled", {}),
    ("resnet-digits", "converged", "width", 10, "labels only", LABELS_ONLY),
    ("resnet-digits", "converged", "width", 10, "distilled", {}),
    ("resnet-digits", "converged", "fresh", 10, "labels only", LABELS_ONLY),
    ("resnet-digits", "converged", "fresh", 10, "distilled", {}),
    *(
        ("mobilenet-digits", teacher, student, 10, label, options)
        for teacher in ("zoo", "converged")
        for student in ("width", "fresh")
        for label, options in (("labels only", LABELS_ONLY), ("distilled", {}))
    ),
)
TEACHERS = {
    "zoo": "{} (the zoo's: 4 epochs)",
    "converged": "{} trained 16 epochs more",
}
STUDENTS = {
    "width": "0.5 width of the teacher (its weights)",
    "fresh": "0.5 width, random weights (a file)",
}


def _converged(teacher, data: dict):
    """A zoo CNN (trained 4 epochs, OneCycle) trained on the labels until its held-out loss stops
    falling: 16 more epochs, Adam 3e-3, cosine (the best weights kept)."""
    from modelpress.compress.train import TrainData
    from modelpress.compress.train.finetune import finetune

    train = TrainData.load(data, teacher, labels_key="y")
    return finetune(teacher, train, teacher=None, config=TrainConfig(epochs=16, lr=LR))[0]


def _fresh_student(teacher, d, seed: int):
    """The teacher's 0.5-width graph with every weight drawn again, as PyTorch initializes a new
    layer (uniform within 1/sqrt(fan-in); BatchNorm scale 1, shift 0, statistics 0 and 1)."""
    import onnx_ir as oir

    student = prune(teacher, data={"image": d.x_train[:256]}, ratio=0.5, train=False).model
    rng = np.random.default_rng(1000 + seed)
    for node in student.graph:
        ins = list(node.inputs)
        if node.op_type in ("Conv", "Gemm"):
            shape = ins[1].const_value.shape
            bound = 1 / np.sqrt(np.prod(shape[1:]))  # Gemm's weight is (out, in): transB=1
            for v in ins[1:3]:
                if v is not None:
                    v.const_value = oir.tensor(
                        rng.uniform(-bound, bound, v.const_value.shape).astype(np.float32)
                    )
        elif node.op_type == "BatchNormalization":
            for v, fill in zip(ins[1:5], (1.0, 0.0, 0.0, 1.0)):
                v.const_value = oir.tensor(np.full(v.const_value.shape, fill, np.float32))
    return student


def _paired(a: list[float], b: list[float]) -> dict:
    """``b - a`` per seed, in points: mean, standard deviation, standard error, wins and losses."""
    diff = (np.array(b) - np.array(a)) * 100
    return {
        "mean": float(diff.mean()),
        "std": float(diff.std(ddof=1)),
        "se": float(diff.std(ddof=1) / np.sqrt(len(diff))),
        "better": int((diff > 0).sum()),
        "same": int((diff == 0).sum()),
        "worse": int((diff < 0).sum()),
    }


def bench_distill() -> list[dict]:
    from modelpress.compress.distill import distill

    d, data = _digits()
    teachers, rows = {}, []
    for name in dict.fromkeys(run[0] for run in DISTILL_RUNS):
        original = load(zoo.build(name, WORK / f"{name}.onnx"))
        for key, model in (("zoo", original), ("converged", _converged(original, data))):
            teachers[name, key] = model
            rows.append(
                {
                    "teacher": TEACHERS[key].format(name),
                    "variant": "teacher",
                    "accuracy": _accuracy(model, d),
                    "accuracies": [],
                    "params": param_count(model),
                }
            )
            print(rows[-1], flush=True)
    for name, key, student, epochs, label, options in DISTILL_RUNS:
        teacher = teachers[name, key]
        accs, secs = [], 0.0
        for seed in DISTILL_SEEDS:
            given = (
                {"width": 0.5}
                if student == "width"
                else {"student": _fresh_student(teacher, d, seed)}
            )
            r = distill(
                teacher,
                data=data,
                labels_key="y",
                train=TrainConfig(epochs=epochs, lr=LR, seed=seed),
                **given,
                **options,
            )
            accs.append(_accuracy(r.model, d))
            secs += r.seconds
        row = {
            "teacher": TEACHERS[key].format(name),
            "student": STUDENTS[student],
            "epochs": epochs,
            "variant": label,
            "accuracy": float(np.mean(accs)),
            "std": float(np.std(accs, ddof=1)),
            "accuracies": accs,
            "params": r.params_student,
            "features": len(r.features),
            "seconds": secs / len(DISTILL_SEEDS),
        }
        same = [
            x
            for x in rows
            if (x.get("teacher"), x.get("student"), x.get("epochs"))
            == (row["teacher"], row["student"], epochs)
        ]
        base = next((x for x in same if x["variant"] == "labels only"), None)
        if base is not None:
            row["vs_labels"] = _paired(base["accuracies"], accs)
        rows.append(row)
        print(rows[-1], flush=True)
    return rows


STDLIB_SKIP = {
    "antigravity",
    "this",
    "idlelib",
    "tkinter",
    "turtle",
    "turtledemo",
    "lib2to3",
    "ensurepip",
    "venv",
    "test",
}


def _docstrings():
    """The docstrings of Python's standard library: each module's, its functions' and classes',
    and the classes' methods'."""
    import contextlib
    import importlib

    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in STDLIB_SKIP:
            continue
        try:
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                mod = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - modules this platform lacks (winreg, ...)
            continue
        yield mod.__doc__ or ""
        for attr in sorted(dir(mod)):
            obj = None if attr.startswith("_") else getattr(mod, attr, None)
            if obj is None:
                continue
            yield inspect.getdoc(obj) or ""
            if inspect.isclass(obj):
                yield from (
                    inspect.getdoc(getattr(obj, m, None)) or ""
                    for m in sorted(vars(obj))
                    if not m.startswith("_")
                )


def _sentences(n: int) -> list[str]:
    """English sentences from the standard library's docstrings, shuffled (seed 0; no download;
    about 7,000 on Python 3.11)."""
    found = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated modules and attributes say so when read
        for doc in _docstrings():
            for s in re.split(r"(?<=[.!?])\s+", " ".join(doc.split())):
                words = s.split()
                if 6 <= len(words) <= 40 and s[0].isupper() and not re.search(r"[>{}\[\]=`|]", s):
                    found.add(s)
    out = sorted(found)
    np.random.default_rng(0).shuffle(out)
    return out[:n]


def bench_minilm(
    train_sentences: int = 6800, held_sentences: int = 128, seq: int = 24, epochs: int = 5
) -> list[dict]:
    from modelpress.compress.distill import distill
    from modelpress.compress.train import TrainData
    from modelpress.verify.metrics import compare
    from modelpress.zoo.minilm import tokenize

    original = load(zoo.build("minilm", WORK / "minilm.onnx"))
    sents = _sentences(train_sentences + held_sentences)
    train = tokenize(sents[:train_sentences], seq)
    held = tokenize(sents[train_sentences:], seq)
    held_data = TrainData.load(held, original)
    shape = {"ratio": 0.5, "head_ratio": 1 / 3}
    # the units chosen by their weights' L1 norm (the default), and on the data a ratio per layer, for reference
    by_weights = prune(original, data=train, importance="l1", train=False, **shape)
    per_layer = prune(
        original, data=train, importance=MINILM_IMPORTANCE, refit=True, train=False, **shape
    )
    t = time.perf_counter()
    # chosen on the data across all layers (the error each removal adds), the layers that read them refit
    pruned = prune(
        original,
        data=train,
        importance=MINILM_IMPORTANCE,
        refit=True,
        global_ranking=True,
        train=False,
        **shape,
    )
    # distilled: the pruned model is the student, the original the teacher (outputs and hidden states)
    r = distill(
        original,
        data=train,
        student=pruned.model,
        temperature=1.0,
        soft="cosine",
        train=TrainConfig(epochs=epochs, lr=1e-4, batch_size=16, val_fraction=0.1),
    )
    seconds = time.perf_counter() - t
    cosines = {
        "pruned_l1": compare(original, by_weights.model, held_data).cosine,
        "pruned_per_layer": compare(original, per_layer.model, held_data).cosine,
        "pruned_only": compare(original, pruned.model, held_data).cosine,
        "distilled": compare(original, r.model, held_data).cosine,
    }
    feeds = {b: tokenize((sents[train_sentences:] * 2)[:b], seq) for b in (1, 8)}
    lat = _latency({"original": original, "pruned + distilled": r.model}, feeds, rounds=20)
    row = {
        "sentences": [train_sentences, held_sentences],
        "seq": seq,
        "epochs": epochs,
        "importance": MINILM_IMPORTANCE,
        "refit": True,
        "global_ranking": True,
        "cosine_pruned_l1": cosines["pruned_l1"],
        "cosine_pruned_per_layer": cosines["pruned_per_layer"],
        "cosine_pruned_only": cosines["pruned_only"],
        "cosine_distilled": cosines["distilled"],
        "curve": r.training.val if r.training else [],
        "params": [param_count(original), param_count(r.model)],
        "size": [_size(original), _size(r.model)],
        "latency": lat,
        "seconds": seconds,
        "groups": pruned.steps[0]["groups"] if pruned.steps else [],
    }
    print({k: v for k, v in row.items() if k != "groups"}, flush=True)
    return [row]


SECTIONS = {
    "prune": bench_prune,
    "deep": bench_deep,
    "qat": bench_qat,
    "distill": bench_distill,
    "minilm": bench_minilm,
}


def write_page() -> None:
    from write_train_page import page  # noqa: E402  (the table layout lives beside this script)

    (RESULTS / "train.md").write_text(page(_load_results()))


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--only", default=",".join(SECTIONS))
    p.add_argument("--page-only", action="store_true")
    args = p.parse_args(argv)
    WORK.mkdir(exist_ok=True)
    RESULTS.mkdir(exist_ok=True)
    if not args.page_only:
        use_global_thread_pool(intra_op_threads=1)
        torch.set_num_threads(1)  # a shared 2-core machine: one thread each for ORT and torch
        torch.manual_seed(0)
        for name in args.only.split(","):
            try:
                _save(name, SECTIONS[name]())
            except Exception:  # noqa: BLE001 - one failed section must not lose the others
                import traceback

                traceback.print_exc()
    sys.path.insert(0, str(ROOT))
    write_page()


if __name__ == "__main__":
    main()
