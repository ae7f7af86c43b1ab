"""Calibration data: where it comes from, checking it against the model, and streaming it through
observers.

Sources (``CalibrationSet.from_source``): whatever ``runtime.samples.open_samples`` reads (an
``.npz``, a folder of ``.npz`` batches, of images or audio files, a ``.jsonl`` of texts, a dict of
arrays, an iterable of input dicts), raw files through the declared pre-processing that ``run``
and ``serve`` apply.

Every batch is checked against the model's inputs (names, dtypes, ranks, fixed sizes) with
``modelpress.verify.check_feeds``; the first bad batch raises one ``InputError`` naming the source.
An empty source is an error. Statistics are collected by running the model under ONNX Runtime
(graph optimizations disabled, so the tensors observed are the model's own) with the observed
tensors added as extra outputs; batches stream through and only the observers' fixed-size state
is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import islice

import numpy as np
import onnx_ir as ir

from modelpress.errors import InputError, OptionError
from modelpress.ir.feeds import check_feeds
from modelpress.ir.graph import copy_model
from modelpress.ir.match import values_by_name
from modelpress.runtime.ort import session
from modelpress.runtime.samples import Batch, ImagePreprocess, open_samples

# Batches of a one-shot iterator kept for the passes after calibration that read only a few: the
# four the measured bias correction averages over, and two more the check of the result runs on.
REPLAY = 6

Progress = Callable[[int, int | None], None]  # (batches done, total batches or None)


class CalibrationSet:
    """A re-iterable stream of checked batches (``for batch in cal.batches(model)``)."""

    def __init__(
        self,
        make_iter: Callable[[ir.Model], Iterator[Batch]],
        *,
        name: str,
        total: int | None,
        once: bool = False,
    ):
        self._make_iter = make_iter
        self.name = name
        self.total = total
        self._once = once
        self._used = False
        self._kept: list[Batch] = []  # a one-shot iterator's first batches, for later passes
        self._all_kept = False  # a one-shot iterator that ended within its kept batches

    @classmethod
    def from_source(
        cls,
        source,
        *,
        batch_size: int = 16,
        labels_key: str | None = None,
        image: ImagePreprocess | None = None,
        limit: int | None = None,
    ) -> CalibrationSet:
        if isinstance(source, CalibrationSet):
            return source
        samples = open_samples(
            source,
            batch_size=batch_size,
            labels_key=labels_key,
            pre=image,
            limit=limit,
            name="calibration data",
        )
        return cls(samples.make, name=samples.name, total=samples.total, once=samples.once)

    def batches(self, model: ir.Model, limit: int | None = None) -> Iterator[Batch]:
        """Checked batches (the first ``limit``); raises InputError on the first bad one, or when
        there is none. A one-shot iterator is read once: later passes get the first ``REPLAY``
        batches it gave, kept in memory, when they need no more (the error report, the measured
        bias correction); a pass over all of it again is refused."""
        if self._once and self._used:
            # replayable: the request fits in what was kept, or what was kept is all there was
            if not self._all_kept and (limit is None or limit > len(self._kept)):
                raise OptionError(
                    "calibration data: the iterator was already consumed; pass a list or a function returning an iterator"
                )
            yield from self._kept[:limit]
            return
        self._used = True
        n = 0
        live: set[str] = set()  # float inputs seen with a nonzero value
        floats: set[str] = set()
        for batch in islice(self._make_iter(model), limit):
            check_feeds(model, batch.feeds, source=f"{self.name} (batch {n})")
            _check_finite(batch.feeds, source=f"{self.name} (batch {n})")
            for name, arr in batch.feeds.items():
                if arr.dtype.kind == "f":
                    floats.add(name)
                    if name not in live and np.any(arr):
                        live.add(name)
            if self._once and n < REPLAY:
                self._kept.append(batch)
            n += 1
            yield batch
        # read to its end (fewer batches than asked for), and every batch was kept
        self._all_kept = self._once and (limit is None or n < limit) and n <= REPLAY
        if n == 0:
            raise InputError(f"{self.name}: the calibration set is empty")
        # (one zero input is fine, a recurrent model's initial state; all of them carry nothing)
        if floats and not live and limit is None:
            raise InputError(
                f"{self.name}: every input is zero in every sample: calibrating on it would give "
                "the scales no range; use real samples"
            )


def _check_finite(feeds: dict[str, np.ndarray], *, source: str) -> None:
    """A NaN or infinity in the calibration data would become a NaN scale (every output NaN)."""
    for name, arr in feeds.items():
        bad = int(np.size(arr) - np.isfinite(arr).sum()) if arr.dtype.kind == "f" else 0
        if bad:
            raise InputError(f"{source}: input {name!r} has {bad} NaN or infinite value(s)")


def fetching(model: ir.Model, names: Iterable[str]) -> ir.Model:
    """``model``, or a copy of it that also returns the values ``names`` (a graph input is fed,
    not fetched; a value of unknown type is taken for float32, the activations observed)."""
    present = {v.name for v in (*model.graph.inputs, *model.graph.outputs)}
    extra = [n for n in dict.fromkeys(names) if n not in present]
    if not extra:
        return model
    m = copy_model(model)
    values = values_by_name(m.graph)
    for name in extra:
        v = values[name]
        if v.type is None:
            v.type = ir.TensorType(ir.DataType.FLOAT)
        m.graph.outputs.append(v)
    return m


def collect(
    model: ir.Model,
    cal: CalibrationSet,
    observers: dict[str, list],
    *,
    progress: Progress | None = None,
) -> int:
    """Run every calibration batch through ``model`` and give each observed tensor to its observers
    (anything with ``observe(x)``); returns the number of batches."""

    graph_inputs = {v.name for v in model.graph.inputs}
    fetched = [n for n in observers if n not in graph_inputs]
    sess = session(fetching(model, fetched), optimize="disabled")
    n = 0
    if progress:
        progress(0, cal.total)
    for batch in cal.batches(model):
        try:
            outs = (
                dict(zip(fetched, sess.run(fetched, batch.feeds), strict=True)) if fetched else {}
            )
        except Exception as exc:  # ORT's own exception types
            raise InputError(
                f"{cal.name} (batch {n}): the model failed to run: {str(exc).strip().splitlines()[0][:300]}"
            ) from None
        for name, obs in observers.items():
            x = batch.feeds[name] if name in graph_inputs else outs[name]
            for o in obs:
                o.observe(x)
        n += 1
        if progress:
            progress(n, cal.total)
    return n
