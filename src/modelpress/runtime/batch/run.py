"""``run_batch``: a model over a data set, resumable, with pre-processing in parallel.

    result = run_batch("model.onnx", "images/", output="predictions.jsonl", workers="auto")

DATA is a folder of images or audio files, a ``.jsonl`` of texts (the model must declare its
pre-processing: ``modelpress pipeline``), or an ``.npz`` of input arrays. Batches are formed only
where the model's outputs are per-sample (``split.batch_rule``); otherwise items run one at a time
and an ``.npz`` runs whole, and ``result.note`` says why. A run that was killed continues from its
journal (``journal.py``) when started again with the same model, data and output.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from modelpress.errors import InputError, OptionError
from modelpress.ir.feeds import as_model, check_feeds
from modelpress.ir.files import output_dir
from modelpress.ir.io import model_bytes
from modelpress.runtime.batch import output as out
from modelpress.runtime.batch.journal import Journal
from modelpress.runtime.batch.ray_data import run_on_ray
from modelpress.runtime.batch.sources import Arrays, Items, open_data
from modelpress.runtime.batch.split import BatchRule, batch_rule
from modelpress.runtime.batch.stream import Prepared, Timing, resolve_workers, start_pool, stream
from modelpress.runtime.ort_backend import OrtBackend, OrtOptions
from modelpress.runtime.processing import Processing
from modelpress.runtime.session import Session

DEFAULT_BATCH = 8

Progress = Callable[[int, int], None]  # (items done, items in all)


@dataclass
class BatchResult:
    output: str
    items: int  # items in the data set
    written: int  # items run by this call
    resumed: int  # items found done in the journal
    errors: int  # items that could not be read (an error line each)
    batch_size: int
    batches: int
    workers: int
    rule: dict
    note: str  # how the batches were formed, when not as asked
    device: str
    elapsed_s: float
    busy_s: float  # inside the model
    wait_s: float  # waiting for a prepared batch
    emit_s: float  # answers and journal
    warnings: list[str] = field(default_factory=list)
    placement: list[str] = field(default_factory=list)

    @property
    def items_per_s(self) -> float:
        return self.written / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def busy_fraction(self) -> float:
        return self.busy_s / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(items_per_s=self.items_per_s, busy_fraction=self.busy_fraction)
        return d


def run_batch(
    model,
    data: str | os.PathLike,
    *,
    output: str | os.PathLike,
    batch_size: int | None = None,
    workers: int | str | None = "auto",
    prefetch: int | None = None,
    backend: str = "ort",
    device: str = "auto",
    place: list[str] | None = None,
    strict: bool = False,
    restart: bool = False,
    ray: bool | str = False,
    ray_actors: int | None = None,
    labels_key: str | None = None,
    rule: BatchRule | Callable[[Callable], BatchRule] | None = None,
    source_file: str | os.PathLike | None = None,
    progress: Progress | None = None,
) -> BatchResult:
    """Run ``model`` (a path or ``onnx_ir.Model``) on every item of ``data`` into ``output``.

    An ``.npz`` may hold labels beside the inputs (the file a training command reads): the array
    named ``labels_key`` (default: one named ``labels`` that is not an input) is left out.
    ``rule``: how the model batches (default: read from the graph, ``split.batch_rule``), or a
    function that decides it given a way to run the model (``rule(run)``, as
    ``verify.batching.decide_batching`` does), called with the run's own session. ``source_file``:
    the file ``model`` was opened from (a package), fingerprinted instead of the model's bytes."""

    fmt = out.output_format(output)
    refuse_overwrite(output, model, data)
    output_dir(output)
    if batch_size is not None and batch_size < 1:
        raise OptionError("`batch_size` must be at least 1")
    n_workers = resolve_workers(workers)
    m = as_model(model)
    processing = Processing.from_model(m)
    kind = processing.pre.kind if processing is not None and processing.pre is not None else None
    source = open_data(data, kind=kind)
    dropped = ""
    if isinstance(source, Arrays):
        source, dropped = _without_labels(source, m, labels_key, data)
    if isinstance(source, Items) and fmt == "npz":
        raise OptionError(f"-o {output}: predictions of {kind} items go to a .jsonl file")
    sess = None
    if callable(rule) and not isinstance(rule, BatchRule):
        if ray:
            rule = rule(None)
        else:  # decided on the session the run will use: one session, not two
            sess = Session(
                m, backend=_backend(backend, n_workers), device=device, place=place, strict=strict
            )
            rule = rule(lambda feeds: sess.run(feeds, check=False))
    rule = rule or batch_rule(m)
    plan = _plan(source, rule, batch_size)
    if isinstance(source, Arrays):
        check_feeds(m, _first(source, plan), source=str(data))
        _refuse_declared_zero(m, source, data)
    fingerprint = _fingerprint(m, source_file or model, source, processing, fmt, plan)

    journal = Journal(output, fingerprint, restart=restart)
    try:
        resumed = len(journal.done)
        total = len(source) if plan.split else 1
        done = [resumed]

        def emit_records(items: list[int], data_: bytes, errors: int = 0) -> None:
            journal.append(items, data_, errors=errors)
            done[0] += len(items)
            if progress:
                progress(done[0], total)

        if progress:
            progress(resumed, total)
        if ray:
            if not isinstance(source, Items):
                raise OptionError(
                    "`ray` reads a folder of files or a .jsonl of texts; run an .npz without `ray`"
                )
            sess_info, timing = run_on_ray(
                model_bytes(m), processing, source, journal.done,
                batch_size=plan.size, address=None if ray is True else ray, actors=ray_actors,
                backend=backend, device=device, emit=emit_records,
            )  # fmt: skip
            warnings, placement, dev = [], [], sess_info
        else:
            # Workers start while the model loads: their start-up is not the model's idle time.
            items = isinstance(source, Items) and n_workers > 0 and len(journal.done) < len(source)
            pool = start_pool(processing, n_workers) if items else None
            try:
                sess = sess or Session(
                    m,
                    backend=_backend(backend, n_workers),
                    device=device,
                    place=place,
                    strict=strict,
                )
            except BaseException:
                if pool is not None:
                    pool.shutdown(cancel_futures=True)
                raise
            timing = _run_local(
                sess,
                source,
                processing,
                plan,
                journal.done,
                fmt,
                emit_records,
                n_workers,
                prefetch,
                pool,
            )
            warnings, placement, dev = list(sess.warnings), sess.plan.log_lines(), sess.device
        written = done[0] - resumed
        out.finalize(journal, output, fmt, total)
        errors = sum(r.errors for r in journal)
        journal.remove()
    except BaseException:
        if not journal.records:  # nothing done: leave no trace (a stopped run keeps its journal)
            journal.remove()
        raise
    finally:
        journal.close()
    return BatchResult(
        output=str(output), items=len(source), written=written, resumed=resumed, errors=errors,
        batch_size=plan.size, batches=timing.batches, workers=0 if ray else n_workers,
        rule=rule.to_dict(), note="; ".join(n for n in (plan.note, dropped) if n), device=dev, elapsed_s=timing.elapsed_s,
        busy_s=timing.busy_s, wait_s=timing.wait_s, emit_s=timing.emit_s,
        warnings=warnings, placement=placement,
    )  # fmt: skip


def _backend(name: str, workers: int):
    """The backend to run with: ONNX Runtime's threads do not spin while idle when workers
    share the CPU with it (an idle spinning pool takes the cores the workers need)."""
    if name == "ort" and workers > 0:
        return OrtBackend(OrtOptions(spin=False))
    return name


def refuse_overwrite(output, model, data) -> None:
    """An output that is the model or the data would destroy the user's file: refuse it."""
    target = Path(output)
    for what, path in (("the model", model), ("the input data", data)):
        if not isinstance(path, (str, os.PathLike)):
            continue
        p = Path(path)
        same = target.resolve() == p.resolve() or (
            target.exists() and p.exists() and os.path.samefile(target, p)
        )
        if same:
            raise OptionError(f"-o {output}: is {what}; write the predictions to another file")


@dataclass(frozen=True)
class _Plan:
    split: bool  # rows run in batches (False: an .npz runs whole, as one item)
    size: int
    fixed: int | None
    note: str


def _plan(source: Items | Arrays, rule: BatchRule, asked: int | None) -> _Plan:
    if isinstance(source, Arrays):
        if asked is None:
            return _Plan(False, len(source), None, "")
        if source.rows is None:
            return _Plan(
                False,
                1,
                None,
                "--batch-size ignored: the inputs do not share their first dimension; ran the batch whole",
            )
        if not rule.per_sample:
            return _Plan(
                False,
                source.rows,
                None,
                f"--batch-size ignored: ran the batch whole because {rule.reason}",
            )
        if rule.fixed is not None and asked != rule.fixed:
            return _Plan(
                True,
                rule.fixed,
                rule.fixed,
                f"batches of {rule.fixed}: the model fixes its batch size",
            )
        return _Plan(True, asked, rule.fixed, "")
    if rule.fixed is not None and rule.per_sample:
        note = (
            f"batches of {rule.fixed}: the model fixes its batch size"
            if asked not in (None, rule.fixed)
            else ""
        )
        return _Plan(True, rule.fixed, rule.fixed, note)
    if not rule.per_sample:
        if rule.fixed is not None:
            raise OptionError(
                f"the model takes exactly {rule.fixed} samples a run and {rule.reason}; give an .npz of inputs"
            )
        note = f"items run one at a time because {rule.reason}" if asked not in (None, 1) else ""
        return _Plan(True, 1, None, note)
    return _Plan(True, asked or DEFAULT_BATCH, None, "")


def _without_labels(source: Arrays, model, labels_key: str | None, data) -> tuple[Arrays, str]:
    """``source`` without its labels array, and a note saying which was left out."""
    inputs = {v.name for v in model.graph.inputs}
    key = labels_key or "labels"
    if labels_key is not None and key not in source.arrays:
        raise InputError(
            f"{data}: no array named {key!r} (the labels key); arrays: {', '.join(source.arrays)}"
        )
    if key not in source.arrays or key in inputs:
        return source, ""
    arrays = {k: v for k, v in source.arrays.items() if k != key}
    leading = {a.shape[0] for a in arrays.values() if a.ndim}
    rows = leading.pop() if len(leading) == 1 and all(a.ndim for a in arrays.values()) else None
    return replace(source, arrays=arrays, rows=rows), f"array {key!r} left out (labels)"


def _refuse_declared_zero(model, source: Arrays, data) -> None:
    """A dimension declared as 0 takes only empty tensors in ONNX Runtime: say so in one line."""
    for value in model.graph.inputs:
        arr = source.arrays.get(value.name)
        if arr is None or value.shape is None:
            continue
        for axis, (dim, got) in enumerate(zip(value.shape, arr.shape)):
            if isinstance(dim, int) and dim == 0 and got != 0:
                raise InputError(
                    f"{data}: input {value.name!r} has size {got} on axis {axis}, where the model "
                    f"declares 0 (shape {[d if isinstance(d, int) else str(d) for d in value.shape]}): "
                    "ONNX Runtime accepts only empty tensors there; export the model with a "
                    "dynamic dimension"
                )


def _first(source: Arrays, plan: _Plan) -> dict[str, np.ndarray]:
    if not plan.split:
        return source.arrays
    return {k: v[: plan.size] for k, v in source.arrays.items()}


def _fingerprint(m, model, source, processing, fmt: str, plan: _Plan) -> str:
    h = hashlib.sha256()
    if isinstance(model, (str, os.PathLike)):
        with open(model, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    else:
        h.update(model_bytes(m))
    h.update(source.fingerprint.encode())
    h.update(json.dumps(processing.to_dict() if processing else None, sort_keys=True).encode())
    h.update(f"{fmt}:{plan.split}".encode())
    return h.hexdigest()


def _batches(
    ids: list[str], payloads: list, pending: list[int], size: int
) -> Iterator[list[tuple]]:
    for start in range(0, len(pending), size):
        yield [(i, ids[i], payloads[i]) for i in pending[start : start + size]]


def _run_local(
    sess,
    source,
    processing,
    plan: _Plan,
    done: set[int],
    fmt: str,
    emit_records,
    workers: int,
    prefetch,
    pool,
) -> Timing:
    if isinstance(source, Items):
        pending = [i for i in range(len(source)) if i not in done]

        def emit(prep: Prepared, outputs) -> None:
            lines = {}
            for index, item_id, message in prep.errors:
                lines[index] = out.json_line(item_id, {"error": message})
            if outputs is not None:
                for index, item_id, answer in zip(
                    prep.items, prep.ids, out.answers(processing, outputs)
                ):
                    lines[index] = out.json_line(item_id, answer)
            order = sorted(lines)
            emit_records(order, b"".join(lines[i] for i in order), len(prep.errors))

        return stream(
            _batches(source.ids, source.payloads, pending, plan.size),
            processing=processing, infer=lambda feeds: sess.run(feeds, check=False), emit=emit,
            workers=workers, prefetch=prefetch, fixed=plan.fixed, pool=pool,
        )  # fmt: skip
    return _run_arrays(sess, source, processing, plan, done, fmt, emit_records)


def _run_arrays(
    sess, source: Arrays, processing, plan: _Plan, done: set[int], fmt: str, emit_records
) -> Timing:
    """Arrays are in memory already: slice them into batches inline, nothing to prepare."""
    timing = Timing()
    start = time.perf_counter()
    if plan.split:
        pending = [i for i in range(len(source)) if i not in done]
        row_batches: list[list[int] | None] = [
            pending[s : s + plan.size] for s in range(0, len(pending), plan.size)
        ]
    else:
        row_batches = [] if 0 in done else [None]  # the whole set, as item 0
    for rows in row_batches:
        if rows is None:
            feeds = source.arrays
        else:  # a batch the model fixes is filled with copies of its last row, dropped after
            index = np.asarray(rows + [rows[-1]] * ((plan.fixed or len(rows)) - len(rows)))
            feeds = {k: v[index] for k, v in source.arrays.items()}
        t0 = time.perf_counter()
        outputs = sess.run(feeds, check=False)
        t1 = time.perf_counter()
        timing.busy_s += t1 - t0
        if rows is None:
            blob = (
                out.npz_bytes(outputs)
                if fmt == "npz"
                else out.json_line("all", {k: v.tolist() for k, v in outputs.items()})
            )
            emit_records([0], blob)
        else:
            outputs = {k: v[: len(rows)] for k, v in outputs.items()}
            if fmt == "npz":
                blob = out.npz_bytes(outputs)
            else:
                blob = b"".join(
                    out.json_line(str(r), a) for r, a in zip(rows, out.answers(processing, outputs))
                )
            emit_records(rows, blob)
        timing.emit_s += time.perf_counter() - t1
        timing.batches += 1
    timing.elapsed_s = time.perf_counter() - start
    return timing
