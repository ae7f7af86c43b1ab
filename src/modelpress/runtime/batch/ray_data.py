"""Batch inference on Ray Data, for data sets and clusters past one machine.

The same steps as the local loop, as two Ray Data stages: pre-processing (``map_batches`` with a
function: tasks, scaled by Ray over the cluster's CPUs) and the model (``map_batches`` with a
class: a pool of actors, each holding one session). The driver takes the answers as they come
(in any order) and writes them to the run's journal, so resuming works as it does locally.

Items are read where the pre-processing stage runs: on a cluster the files must be on storage
every node sees, and modelpress must be installed on the nodes. ``ray`` is an extra, imported
only here.
"""

from __future__ import annotations

import logging
import math
import pickle
import time
from pathlib import Path

import numpy as np

from modelpress.errors import InputError, OptionError, require
from modelpress.ir import load
from modelpress.runtime.batch import output as out
from modelpress.runtime.batch.sources import Items
from modelpress.runtime.batch.stream import Timing
from modelpress.runtime.session import Session


def _ray():
    return require("ray", extra="ray", purpose="--ray (batch inference on Ray Data)")


class _Prepare:
    """The pre-processing stage: each row's item prepared, pickled (items may differ in shape:
    texts are padded only when the model stage joins them into a batch)."""

    def __init__(self, processing, is_path: bool):
        self.processing = processing
        self.is_path = is_path

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        prepared, errors = [], []
        for item_id, payload in zip(batch["id"], batch["payload"]):
            item = Path(payload) if self.is_path else str(payload)
            try:
                prepared.append(pickle.dumps(self.processing.prepare(item, label=str(item_id))))
                errors.append("")
            except InputError as exc:
                prepared.append(b"")
                errors.append(str(exc))
        return {
            "index": batch["index"],
            "id": batch["id"],
            "prepared": np.array(prepared, dtype=object),
            "error": np.array(errors, dtype=object),
        }


class _Model:
    """The model stage: one session per actor; answers as JSON lines."""

    def __init__(self, model: bytes, processing, backend: str, device: str):
        import tempfile

        # The driver sends the model's bytes (it may have no file a node can see); ir.load reads files.
        with tempfile.TemporaryDirectory(prefix="modelpress-ray-") as tmp:
            path = Path(tmp) / "model.onnx"
            path.write_bytes(model)
            self.session = Session(load(path), backend=backend, device=device)
        self.processing = processing

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        lines: dict[int, bytes] = {}
        ok = [i for i, e in enumerate(batch["error"]) if not e]
        for i, e in enumerate(batch["error"]):
            if e:
                lines[i] = out.json_line(str(batch["id"][i]), {"error": str(e)})
        busy = 0.0
        if ok:
            feeds = self.processing.collate([pickle.loads(batch["prepared"][i]) for i in ok])
            t0 = time.perf_counter()
            outputs = self.session.run(feeds, check=False)
            busy = time.perf_counter() - t0
            for i, answer in zip(ok, out.answers(self.processing, outputs)):
                lines[i] = out.json_line(str(batch["id"][i]), answer)
        n = len(batch["index"])
        return {
            "index": batch["index"],
            "line": np.array([lines[i] for i in range(n)], dtype=object),
            "busy": np.array([busy] + [0.0] * (n - 1)),
            "failed": np.array([bool(e) for e in batch["error"]]),
        }


def cpu_shares(cpus: int, actors: int) -> tuple[float, float]:
    """The CPUs each model actor and each pre-processing task reserve on a cluster of ``cpus``.

    An actor holds its CPUs for the whole run: ``actors`` of one CPU each on a cluster of
    ``actors`` CPUs or fewer leave none for pre-processing, whose tasks then never start and the
    run waits forever. So actors take one CPU each only while at least one stays free; else the
    cluster is shared in ``actors + 1`` equal parts, one of them for the pre-processing tasks
    (shares rounded down to 1/100 of a CPU, Ray's precision, so that they always fit).
    """
    if actors < cpus:
        return 1.0, 1.0
    share = math.floor(100 * cpus / (actors + 1)) / 100
    if share <= 0:
        raise OptionError(
            f"`ray_actors` {actors}: too many model actors for a cluster of {cpus} CPU(s)"
        )
    free = math.floor(100 * (cpus - actors * share)) / 100
    return share, min(1.0, free)


def run_on_ray(
    model: bytes,
    processing,
    source: Items,
    done: set[int],
    *,
    batch_size: int,
    address: str | None,
    actors: int | None,
    backend: str,
    device: str,
    emit,
) -> tuple[str, Timing]:
    """Run the items of ``source`` not in ``done`` on Ray Data; ``emit(items, lines)`` each batch."""
    ray = _ray()
    timing = Timing()
    start = time.perf_counter()
    if not ray.is_initialized():
        try:
            ray.init(
                address=address,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        except Exception as exc:  # noqa: BLE001 - Ray raises several classes for an unreachable cluster
            msg = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            raise OptionError(
                f"`ray`{' ' + address if address else ''}: cannot start or reach a Ray cluster ({msg})"
            ) from None
    ctx = ray.data.DataContext.get_current()
    ctx.print_on_execution_start = False
    # Ray Data logs each execution and draws progress bars on stderr; the caller shows progress.
    log = logging.getLogger("ray.data")
    level = log.level
    log.setLevel(logging.ERROR)
    ctx.enable_progress_bars = False
    try:
        _execute(
            ray, model, processing, source, done, batch_size, actors, backend, device, emit, timing
        )
    finally:
        log.setLevel(level)
    timing.elapsed_s = time.perf_counter() - start
    return f"ray ({device})", timing


def _execute(
    ray, model, processing, source, done, batch_size, actors, backend, device, emit, timing
) -> None:
    pending = [i for i in range(len(source)) if i not in done]
    if pending:
        is_path = isinstance(source.payloads[0], Path)
        rows = [
            {"index": i, "id": source.ids[i], "payload": str(source.payloads[i])} for i in pending
        ]
        n_actors = actors or 1
        # Up to one pre-processing task per CPU of the cluster; a task pool of another size than
        # the actor pool also keeps Ray from fusing the two stages into one (no overlap).
        cpus = int(ray.cluster_resources().get("CPU", 1))
        pre_tasks = cpus if cpus != n_actors else cpus + 1
        actor_cpus, task_cpus = cpu_shares(cpus, n_actors)
        ds = ray.data.from_items(rows)
        ds = ds.map_batches(
            _Prepare(processing, is_path),
            batch_size=batch_size,
            batch_format="numpy",
            compute=ray.data.TaskPoolStrategy(size=pre_tasks),
            num_cpus=task_cpus,
        )
        ds = ds.map_batches(
            _Model,
            fn_constructor_kwargs={
                "model": model,
                "processing": processing,
                "backend": backend,
                "device": device,
            },
            batch_size=batch_size,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=n_actors),
            num_cpus=actor_cpus,
            num_gpus=1 if device.startswith("cuda") else None,
        )
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            items = [int(i) for i in batch["index"]]
            order = np.argsort(items, kind="stable")
            errors = int(np.sum(batch["failed"]))
            emit([items[k] for k in order], b"".join(batch["line"][k] for k in order), errors)
            timing.busy_s += float(np.sum(batch["busy"]))
            timing.batches += 1
