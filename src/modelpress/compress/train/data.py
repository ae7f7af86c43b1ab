"""Training data: where it comes from, checked against the model once, then shuffled into batches.

Sources (``TrainData.load``): whatever ``runtime.samples.open_samples`` reads (an ``.npz`` or a
dict of arrays, samples along axis 0; a folder of ``.npz`` batches, of images or audio files in
class subfolders, where the class is the subfolder's index in sorted order, or flat without
labels; a ``.jsonl`` of texts; an iterable of batches: dicts of arrays or ``(inputs, labels)``
pairs), raw files through the declared pre-processing that ``run`` and ``serve`` apply. Batches
whose shapes agree beyond axis 0 are joined into one pool of samples, otherwise each keeps its own
shape (text of varying length) and is shuffled within.

The data is held in memory as *chunks*: groups of samples of one shape. Every chunk is checked
against the model's inputs (names, dtypes, ranks, fixed sizes) and for NaN/inf before any training;
labels must be one per sample. An empty set, a missing labels array where labels are needed, or a
mismatch is one ``InputError`` naming the source.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from modelpress.errors import InputError, OptionError
from modelpress.ir.feeds import check_feeds
from modelpress.runtime.samples import Batch, open_samples


@dataclass
class Chunk:
    """Samples of one shape: inputs by name (samples on axis 0) and their labels, if any."""

    inputs: dict[str, np.ndarray]
    labels: np.ndarray | None = None

    def __len__(self) -> int:
        return int(next(iter(self.inputs.values())).shape[0])

    def take(self, index: np.ndarray) -> Chunk:
        return Chunk(
            {k: v[index] for k, v in self.inputs.items()},
            None if self.labels is None else self.labels[index],
        )


@dataclass
class TrainData:
    """Checked training samples in memory (see the module docstring for the sources)."""

    chunks: list[Chunk]
    name: str = "training data"
    classes: list[str] = field(default_factory=list)  # class names of an image folder

    @property
    def has_labels(self) -> bool:
        return all(c.labels is not None for c in self.chunks)

    def __len__(self) -> int:
        return sum(len(c) for c in self.chunks)

    @classmethod
    def load(
        cls,
        source,
        model: ir.Model,
        *,
        labels_key: str | None = None,
        require_labels: bool = False,
        image=None,
        limit: int | None = None,
    ) -> TrainData:
        """Read ``source`` for ``model`` and check it (``InputError`` on the first problem).

        ``require_labels``: the caller trains on labels only, so data without them is an error.
        """
        if isinstance(source, TrainData):
            data = source
        else:
            samples = open_samples(
                source, batch_size=None, labels_key=labels_key, pre=image, name="training data"
            )
            chunks = []
            for i, batch in enumerate(samples.batches(model)):
                if not batch.feeds or any(v.ndim == 0 for v in batch.feeds.values()):
                    raise InputError(
                        f"{samples.name} (batch {i}): every input array needs samples on axis 0"
                    )
                chunks.append(Chunk(batch.feeds, batch.labels))
            data = TrainData(_join(chunks), samples.name, samples.classes)
        if limit is not None:
            data = data.head(limit)
        data.check(model)
        if require_labels and not data.has_labels:
            where = f" (no array {labels_key!r})" if labels_key else " (give the labels key)"
            raise InputError(f"{data.name}: this needs labels and the data has none{where}")
        return data

    def head(self, n: int) -> TrainData:
        """The first ``n`` samples."""
        out, left = [], n
        for c in self.chunks:
            if left <= 0:
                break
            out.append(c.take(np.arange(min(left, len(c)))))
            left -= len(out[-1])
        return TrainData(out, self.name, self.classes)

    def check(self, model: ir.Model) -> None:
        if not self.chunks or len(self) == 0:
            raise InputError(f"{self.name}: the training set is empty")
        labelled = {c.labels is not None for c in self.chunks}
        if len(labelled) > 1:
            raise InputError(f"{self.name}: some batches have labels and some do not")
        for i, chunk in enumerate(self.chunks):
            where = self.name if len(self.chunks) == 1 else f"{self.name} (batch {i})"
            counts = {k: (v.shape[0] if v.ndim else 0) for k, v in chunk.inputs.items()}
            if len(set(counts.values())) > 1:
                raise InputError(
                    f"{where}: inputs have different numbers of samples on axis 0: {counts}"
                )
            check_feeds(model, chunk.inputs, source=where)
            for name, arr in chunk.inputs.items():
                if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                    raise InputError(f"{where}: input {name!r} has NaN or infinite values")
            if chunk.labels is not None:
                n = len(chunk)
                if chunk.labels.ndim == 0 or chunk.labels.shape[0] != n:
                    raise InputError(
                        f"{where}: {n} samples but {chunk.labels.shape[:1] or 'no'} labels; "
                        "give one label per sample"
                    )
                if chunk.labels.dtype.kind == "f" and not np.isfinite(chunk.labels).all():
                    raise InputError(f"{where}: the labels have NaN or infinite values")

    def split(self, fraction: float, *, seed: int = 0) -> tuple[TrainData, TrainData | None]:
        """``(train, held_out)``: a random ``fraction`` of each chunk's samples held out.

        None when ``fraction`` is 0 or the set is too small to spare a sample for it.
        """
        if not 0 <= fraction < 1:
            raise OptionError(f"held-out fraction {fraction}: choose a value in [0, 1)")
        if fraction == 0:
            return self, None
        rng = np.random.default_rng(seed)
        train, held = [], []
        for c in self.chunks:
            order = rng.permutation(len(c))
            k = int(round(len(c) * fraction))
            if k == 0 or k == len(c):
                train.append(c)
                continue
            held.append(c.take(np.sort(order[:k])))
            train.append(c.take(np.sort(order[k:])))
        if not held:
            return self, None
        return TrainData(train, self.name, self.classes), TrainData(
            held, f"{self.name} (held out)", self.classes
        )

    def batches(
        self, batch_size: int, *, rng: np.random.Generator | None = None
    ) -> Iterator[Batch]:
        """One pass over every sample in batches; shuffled (chunks and samples) when ``rng``."""
        order = rng.permutation(len(self.chunks)) if rng is not None else range(len(self.chunks))
        for ci in order:
            chunk = self.chunks[ci]
            n = len(chunk)
            idx = rng.permutation(n) if rng is not None else np.arange(n)
            for start in range(0, n, batch_size):
                sel = idx[start : start + batch_size]
                part = chunk.take(np.sort(sel)) if rng is None else chunk.take(sel)
                yield Batch(part.inputs, part.labels)

    def batch_count(self, batch_size: int) -> int:
        return sum(-(-len(c) // batch_size) for c in self.chunks)

    def sample(self, n: int) -> dict[str, np.ndarray]:
        """The first ``n`` samples' inputs (of the first chunk): a feed for shape probing."""
        c = self.chunks[0]
        return {k: v[: max(1, min(n, len(c)))] for k, v in c.inputs.items()}


def _join(chunks: list[Chunk]) -> list[Chunk]:
    """Batches of one shape become one pool of samples (shuffled across batches)."""
    if len(chunks) < 2:
        return chunks

    def key(c: Chunk):
        return (
            tuple(sorted((k, v.shape[1:], v.dtype.str) for k, v in c.inputs.items())),
            None if c.labels is None else (c.labels.shape[1:], c.labels.dtype.str),
        )

    if len({key(c) for c in chunks}) != 1:
        return chunks
    inputs = {k: np.concatenate([c.inputs[k] for c in chunks]) for k in chunks[0].inputs}
    labels = None if chunks[0].labels is None else np.concatenate([c.labels for c in chunks])
    return [Chunk(inputs, labels)]
