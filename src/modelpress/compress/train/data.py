"""Training data: where it comes from, checked against the model once, then shuffled into batches.

Sources (``TrainData.load``):
- an ``.npz`` file whose arrays are named after the model's inputs, samples along axis 0; the array
  named by ``labels_key`` holds the labels (class indices, or float targets);
- a dict of arrays, read the same way (the in-memory form of an ``.npz``);
- a folder of images in class subfolders (``train/cat/1.png``, ``train/dog/2.png``): the class is
  the subfolder's index in sorted order; a flat folder of images has no labels. Images go through
  an ``ImagePreprocess``: the one given, else one read off the model's image input (its height,
  width, channel count and layout; pixels scaled to 0..1);
- a Python iterable of batches: dicts of arrays (labels under ``labels_key``) or
  ``(inputs, labels)`` pairs; batches whose shapes agree beyond axis 0 are joined into one pool of
  samples, otherwise each keeps its own shape (text of varying length) and is shuffled within.

The data is held in memory as *chunks*: groups of samples of one shape. Every chunk is checked
against the model's inputs (names, dtypes, ranks, fixed sizes) and for NaN/inf before any training;
labels must be one per sample. An empty set, a missing labels array where labels are needed, or a
mismatch is one ``InputError`` naming the source.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir

from modelpress.compress.quantize import ImagePreprocess
from modelpress.errors import InputError, OptionError
from modelpress.ir.feeds import check_feeds, load_npz

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm", ".ppm"}


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
class Batch:
    feeds: dict[str, np.ndarray]
    labels: np.ndarray | None = None


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
        elif isinstance(source, (str, os.PathLike)):
            data = _from_path(Path(source), model, labels_key=labels_key, image=image)
        elif isinstance(source, dict):
            data = _from_arrays(dict(source), labels_key, "training data")
        elif isinstance(source, Iterable) or callable(source):
            items = source() if callable(source) else source
            data = _from_batches(items, labels_key)
        else:
            raise OptionError(
                f"training data of type {type(source).__name__}: pass an .npz path, an image folder, "
                "a dict of arrays or an iterable of batches"
            )
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


def _split_labels(
    arrays: dict[str, np.ndarray], labels_key: str | None, source: str
) -> np.ndarray | None:
    if labels_key is None:
        return None
    if labels_key not in arrays:
        raise InputError(
            f"{source}: no array named {labels_key!r} (the labels key); arrays: {', '.join(arrays) or 'none'}"
        )
    return np.asarray(arrays.pop(labels_key))


def _from_arrays(arrays: dict, labels_key: str | None, name: str) -> TrainData:
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    labels = _split_labels(arrays, labels_key, name)
    if not arrays:
        raise InputError(f"{name}: the training set is empty (no input arrays)")
    if any(v.ndim == 0 for v in arrays.values()):
        raise InputError(f"{name}: every input array needs samples on axis 0")
    return TrainData([Chunk(arrays, labels)], name)


def _from_batches(items: Iterable, labels_key: str | None) -> TrainData:
    chunks: list[Chunk] = []
    for i, item in enumerate(items):
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], dict):
            feeds = {k: np.asarray(v) for k, v in item[0].items()}
            labels = None if item[1] is None else np.asarray(item[1])
        elif isinstance(item, dict):
            feeds = {k: np.asarray(v) for k, v in item.items()}
            labels = (
                _split_labels(feeds, labels_key, f"training data (batch {i})")
                if labels_key
                else None
            )
        else:
            raise InputError(
                f"training data (batch {i}): expected a dict of input arrays or an (inputs, labels) pair, "
                f"got {type(item).__name__}"
            )
        if not feeds or any(v.ndim == 0 for v in feeds.values()):
            raise InputError(
                f"training data (batch {i}): every input array needs samples on axis 0"
            )
        chunks.append(Chunk(feeds, labels))
    return TrainData(_join(chunks), "training data")


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


def _from_path(path: Path, model: ir.Model, *, labels_key: str | None, image) -> TrainData:
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if path.is_file():
        if path.suffix != ".npz":
            raise InputError(f"{path}: training data must be an .npz file or a folder of images")
        data = _from_arrays(load_npz(path), labels_key, str(path))
        return data
    return _from_image_folder(path, model, image)


def _image_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def _from_image_folder(path: Path, model: ir.Model, image) -> TrainData:
    classes = sorted(p.name for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    files: list[tuple[Path, int | None]] = []
    if classes:
        for k, name in enumerate(classes):
            files += [(f, k) for f in _image_files(path / name)]
    else:
        files = [(f, None) for f in _image_files(path)]
    if not files:
        raise InputError(
            f"{path}: the training set is empty (no image files, nor class subfolders with images)"
        )
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise OptionError(
            f"{path}: reading images needs Pillow (`pip install pillow`); or convert them to an .npz"
        ) from None
    input_value = _single_input(model, path)
    prep = image or default_preprocess(input_value, path)
    arrays = []
    for f, _ in files:
        try:
            arrays.append(prep.apply(f))
        except OSError as exc:
            raise InputError(
                f"{f}: cannot read the image: {str(exc).splitlines()[0][:200]}"
            ) from None
    if len({a.shape for a in arrays}) > 1:
        raise InputError(
            f"{path}: images differ in size after pre-processing; declare a resize or crop"
        )
    x = np.stack(arrays).astype(
        np.dtype(input_value.dtype.numpy()) if input_value.dtype else np.float32
    )
    labels = np.array([k for _, k in files], dtype=np.int64) if classes else None
    return TrainData([Chunk({input_value.name: x}, labels)], str(path), classes)


def _single_input(model: ir.Model, path: Path) -> ir.Value:
    inputs = [v for v in model.graph.inputs if v.name not in model.graph.initializers]
    if len(inputs) != 1:
        raise InputError(
            f"{path}: a folder of images feeds a model with one input; this one has {len(inputs)} "
            f"({', '.join(v.name for v in inputs)})"
        )
    return inputs[0]


def default_preprocess(value: ir.Value, source: Path):
    """The pre-processing an image input's shape declares: ``(N, C, H, W)`` or ``(N, H, W, C)``
    with C of 1 or 3 and fixed H and W; pixels scaled to 0..1, no normalisation."""

    dims = list(value.shape) if value.shape is not None else []
    if len(dims) == 4 and dims[1] in (1, 3) and all(isinstance(d, int) for d in dims[2:]):
        layout, c, hw = "NCHW", dims[1], (dims[2], dims[3])
    elif len(dims) == 4 and dims[3] in (1, 3) and all(isinstance(d, int) for d in dims[1:3]):
        layout, c, hw = "NHWC", dims[3], (dims[1], dims[2])
    else:
        raise OptionError(
            f"{source}: input {value.name!r} (shape {dims}) does not declare an image size; "
            "give the pre-processing (ImagePreprocess: size, mean, std, layout)"
        )
    return ImagePreprocess(size=hw, layout=layout, mode="L" if c == 1 else "RGB")
