"""Samples: the one reader of what calibration, training, batch inference and search are given.

``open_samples(source, ...)`` reads, lazily and again on demand:

- an ``.npz`` file (or a dict of arrays, its in-memory form) whose arrays are named after the
  model's inputs; the array named by ``labels_key`` holds the labels. ``batch_size`` slices it
  along each input's first dynamic axis (a recurrent state's batch is its second; an array that is
  exactly the input's static shape is fed whole to every batch); ``batch_size=None`` keeps it one
  batch, samples on axis 0;
- a folder of ``.npz`` files, one batch each (shapes may differ from file to file);
- a folder of images or audio files, flat or in class subfolders (``train/cat/1.png``: the label
  is the subfolder's index in sorted order), through the declared pre-processing;
- a ``.jsonl`` file of texts (a JSON string, or an object with ``"text"`` and optionally ``"id"``
  and the labels key), through the declared text pre-processing;
- a Python iterable of batches (a list, or a function returning a fresh iterator): dicts of
  arrays (labels under ``labels_key``) or ``(inputs, labels)`` pairs.

The pre-processing of raw files is the one ``run`` and ``serve`` apply
(``runtime.processing``): the one given (``pre``: ``"image:resize=256,crop=224"``, a dict, or an
``ImagePreprocess``), else the one stored in the model, else, for images, the one its input's
shape declares (its height, width and channels; pixels scaled to 0..1).

Reading checks the form of what is read (a readable file, labels where asked for); the consumer
checks batches against the model (``ir.feeds.check_feeds``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir

from modelpress.errors import InputError, OptionError
from modelpress.ir.feeds import load_npz
from modelpress.runtime.processing import Processing
from modelpress.runtime.processing.audio import SUFFIXES as AUDIO_SUFFIXES
from modelpress.runtime.processing.image import SUFFIXES as IMAGE_SUFFIXES

SUFFIXES = {"image": IMAGE_SUFFIXES, "audio": AUDIO_SUFFIXES}


@dataclass
class Batch:
    feeds: dict[str, np.ndarray]
    labels: np.ndarray | None = None


@dataclass(frozen=True)
class ImagePreprocess:
    """An image pre-processing in keyword form: resize to exactly ``size`` (H, W), centre-crop to
    ``crop`` (padded with zeros where the image is smaller), multiply by ``scale``, subtract
    ``mean`` and divide by ``std`` (per channel), lay out as ``NCHW`` or ``NHWC``; ``mode`` is
    ``RGB`` or ``L`` (gray). The same steps as ``pipeline --pre image:...``."""

    size: tuple[int, int] | None = None
    crop: tuple[int, int] | None = None
    scale: float = 1.0 / 255.0
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    layout: str = "NCHW"
    mode: str = "RGB"

    def __post_init__(self):
        if self.layout not in ("NCHW", "NHWC"):
            raise OptionError(f"`image.layout` {self.layout!r}: choose NCHW or NHWC")

    def declaration(self) -> dict:
        d = {
            "kind": "image",
            "scale": self.scale,
            "mean": list(self.mean),
            "std": list(self.std),
            "layout": self.layout.lower(),
            "color": "gray" if self.mode == "L" else "rgb",
        }
        if self.size is not None:
            d["resize"] = list(self.size)
        if self.crop is not None:
            d["crop"] = list(self.crop)
        return d


def declared_pre(model: ir.Model, pre=None, *, source: str = "data"):
    """The pre-processing for raw files fed to ``model`` (see the module docstring)."""
    if isinstance(pre, ImagePreprocess):
        pre = pre.declaration()
    if pre is not None and not isinstance(pre, (str, dict)):
        return pre  # a declared ImagePre, TextPre or AudioPre
    if pre is not None:
        return Processing.declare(model, pre=pre).pre
    stored = Processing.from_model(model)
    if stored is not None and stored.pre is not None:
        return stored.pre
    try:
        return Processing.declare(model, pre="image").pre
    except OptionError as exc:
        raise OptionError(
            f"{source}: raw files need a declared pre-processing (`pre`, or one stored in the "
            f"model with `modelpress pipeline`); the model's input does not declare one ({exc})"
        ) from None


@dataclass
class Samples:
    """A re-iterable source of unchecked batches (``for batch in samples.batches(model)``)."""

    make: Callable[[ir.Model], Iterator[Batch]]
    name: str
    total: int | None = None  # batches, when known
    once: bool = False  # a one-shot iterator
    classes: list[str] = field(default_factory=list)  # class subfolders' names

    def batches(self, model: ir.Model) -> Iterator[Batch]:
        return self.make(model)


def open_samples(
    source,
    *,
    batch_size: int | None = 16,
    labels_key: str | None = None,
    pre=None,
    limit: int | None = None,
    name: str = "data",
) -> Samples:
    """The samples at ``source`` (see the module docstring); ``limit`` caps the samples read."""
    if isinstance(source, Samples):
        return source
    if batch_size is not None and batch_size < 1:
        raise OptionError("`batch_size` must be at least 1")
    if isinstance(source, (str, os.PathLike)):
        return _from_path(Path(source), batch_size, labels_key, pre, limit)
    if isinstance(source, dict):
        return Samples(
            lambda m: _array_batches(dict(source), m, batch_size, labels_key, limit, name), name
        )
    if callable(source):
        return Samples(lambda m: _from_items(source(), labels_key, name), name)
    if isinstance(source, Iterable):
        total = len(source) if hasattr(source, "__len__") else None
        once = iter(source) is source
        return Samples(lambda m: _from_items(source, labels_key, name), name, total, once)
    raise OptionError(
        f"{name} of type {type(source).__name__}: pass an .npz path, a folder, a .jsonl file, "
        "a dict of arrays or an iterable of batches"
    )


def split_labels(
    arrays: dict[str, np.ndarray], labels_key: str | None, source: str
) -> np.ndarray | None:
    """Take the labels array out of ``arrays`` (None without a labels key)."""
    if labels_key is None:
        return None
    if labels_key not in arrays:
        raise InputError(
            f"{source}: no array named {labels_key!r} (the labels key); "
            f"arrays: {', '.join(arrays) or 'none'}"
        )
    return np.asarray(arrays.pop(labels_key))


def _from_items(items: Iterable, labels_key: str | None, name: str) -> Iterator[Batch]:
    for i, item in enumerate(items):
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], dict):
            feeds = {k: np.asarray(v) for k, v in item[0].items()}
            labels = None if item[1] is None else np.asarray(item[1])
        elif isinstance(item, dict):
            feeds = {k: np.asarray(v) for k, v in item.items()}
            labels = split_labels(feeds, labels_key, f"{name} (batch {i})") if labels_key else None
        else:
            raise InputError(
                f"{name} (batch {i}): expected a dict of input arrays or an (inputs, labels) "
                f"pair, got {type(item).__name__}"
            )
        yield Batch(feeds, labels)


def _sample_axes(
    model: ir.Model, arrays: dict[str, np.ndarray]
) -> dict[str, tuple[int | None, int]]:
    """For each array, the axis its samples lie along and how many go in one run: the model's
    first dynamic dimension of that input (a recurrent state's batch is its second axis), or none
    for a scalar and for an array that is exactly the input's static shape (fed whole to every
    batch: a sample rate, a fixed state). A static leading dimension (a model made for batch 1)
    takes that many samples per run. Inputs the model does not declare split along axis 0."""
    declared = {v.name: v for v in model.graph.inputs}
    out = {}
    for name, arr in arrays.items():
        v = declared.get(name)
        dims = list(v.shape) if v is not None and v.shape is not None else None
        if arr.ndim == 0 or (
            dims and all(isinstance(d, int) for d in dims) and list(arr.shape) == dims
        ):
            out[name] = (None, 0)
        elif dims is None or len(dims) != arr.ndim:
            out[name] = (0, 0)
        else:
            axis = next((i for i, d in enumerate(dims) if not isinstance(d, int) or d < 1), 0)
            out[name] = (axis, dims[axis] if isinstance(dims[axis], int) and dims[axis] > 0 else 0)
    return out


def _array_batches(
    arrays: dict,
    model: ir.Model,
    batch_size: int | None,
    labels_key: str | None,
    limit: int | None,
    source: str,
) -> Iterator[Batch]:
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    labels = split_labels(arrays, labels_key, source)
    if not arrays:
        raise InputError(f"{source}: the data set is empty (no input arrays)")
    if batch_size is None:  # one batch, samples on axis 0
        if any(v.ndim == 0 for v in arrays.values()):
            raise InputError(f"{source}: every input array needs samples on axis 0")
        if limit is not None:
            arrays = {k: v[:limit] for k, v in arrays.items()}
            labels = None if labels is None else labels[:limit]
        yield Batch(arrays, labels)
        return
    axes = _sample_axes(model, arrays)
    counts = {k: v.shape[axes[k][0]] for k, v in arrays.items() if axes[k][0] is not None}
    if not counts:  # every array is fed whole: one sample
        counts = {k: 1 for k in arrays}
        axes = {k: (None, 0) for k in arrays}
    n = min(counts.values())
    if len(set(counts.values())) > 1:
        raise InputError(
            f"{source}: arrays have different numbers of samples along their batch axes: {counts}"
        )
    if labels is not None and labels.shape[:1] != (n,):
        raise InputError(
            f"{source}: labels {labels_key!r} have {labels.shape[:1]} entries, "
            f"inputs have {n} samples"
        )
    if limit is not None:
        n = min(n, limit)
    fixed = {step for axis, step in axes.values() if step}
    step = min(fixed) if fixed else batch_size
    for start in range(0, n, step):
        stop = min(start + step, n)
        feeds = {
            k: v if axes[k][0] is None else np.take(v, range(start, stop), axis=axes[k][0])
            for k, v in arrays.items()
        }
        yield Batch(feeds, None if labels is None else labels[start:stop])


def _npz_files(files: list[Path], labels_key: str | None, limit: int | None) -> Iterator[Batch]:
    seen = 0
    for f in files:
        if limit is not None and seen >= limit:
            return
        arrays = load_npz(f)
        labels = split_labels(arrays, labels_key, str(f))
        if not arrays:
            raise InputError(f"{f}: no input arrays")
        first = next(iter(arrays.values()))
        seen += first.shape[0] if first.ndim else 1
        yield Batch(arrays, labels)


def _media(folder: Path) -> tuple[list[Path], list[int] | None, list[str]]:
    """The raw files of ``folder`` in sorted order, and their labels from class subfolders."""
    known = IMAGE_SUFFIXES + AUDIO_SUFFIXES

    def files(d: Path) -> list[Path]:
        return sorted(p for p in d.iterdir() if p.is_file() and p.suffix.lower() in known)

    classes = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        return files(folder), None, []
    out, labels = [], []
    for k, c in enumerate(classes):
        found = files(folder / c)
        out += found
        labels += [k] * len(found)
    return out, labels, classes


def _raw_batches(
    files: list,
    labels: list | None,
    model: ir.Model,
    pre,
    batch_size: int | None,
    limit: int | None,
    source: str,
) -> Iterator[Batch]:
    declared = declared_pre(model, pre, source=source)
    if limit is not None:
        files = files[:limit]
        labels = None if labels is None else labels[:limit]
    if declared.kind in SUFFIXES:
        wanted = SUFFIXES[declared.kind]
        keep = [i for i, f in enumerate(files) if Path(f).suffix.lower() in wanted]
        if not keep:
            raise InputError(f"{source}: no {'/'.join(wanted)} files for {declared.kind} input")
        files = [files[i] for i in keep]
        labels = None if labels is None else [labels[i] for i in keep]
    step = batch_size or len(files)
    for start in range(0, len(files), step):
        part = files[start : start + step]
        prepared = [
            declared.prepare(
                f, label=str(f) if isinstance(f, Path) else f"{source} item {start + i}"
            )
            for i, f in enumerate(part)
        ]
        feeds = declared.collate(prepared)
        y = None if labels is None else np.asarray(labels[start : start + step])
        yield Batch(feeds, y)


def read_jsonl(path: Path, labels_key: str | None = None):
    """``(ids, texts, labels or None, raw bytes)`` of a ``.jsonl`` of texts: a JSON string a
    line, or an object with ``"text"`` (and an ``"id"``, and the labels key); blank lines skipped."""
    ids: list[str] = []
    texts: list[str] = []
    labels: list = []
    seen: set[str] = set()
    try:
        raw = path.read_bytes()
        lines = raw.decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot be read as UTF-8 ({type(exc).__name__})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            raise InputError(f"{path}:{number}: not a JSON value") from None
        if isinstance(value, dict) and isinstance(value.get("text"), str):
            text, item_id = value["text"], str(value.get("id", number))
            if labels_key is not None:
                if labels_key not in value:
                    raise InputError(f"{path}:{number}: no {labels_key!r} (the labels key)")
                labels.append(value[labels_key])
        elif isinstance(value, str) and labels_key is None:
            text, item_id = value, str(number)
        else:
            want = (
                f'an object with "text" and {labels_key!r}'
                if labels_key
                else 'a JSON string or an object with "text"'
            )
            raise InputError(f"{path}:{number}: expected {want}")
        if item_id in seen:
            raise InputError(f"{path}:{number}: id {item_id!r} appears twice")
        seen.add(item_id)
        ids.append(item_id)
        texts.append(text)
    if not texts:
        raise InputError(f"{path}: no texts in the file")
    return ids, texts, (labels if labels_key is not None else None), raw


def _from_path(
    path: Path, batch_size: int | None, labels_key: str | None, pre, limit: int | None
) -> Samples:
    name = str(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if path.is_file():
        if path.suffix.lower() == ".npz":
            return Samples(
                lambda m: _array_batches(load_npz(path), m, batch_size, labels_key, limit, name),
                name,
            )
        if path.suffix.lower() == ".jsonl":
            _, texts, labels, _ = read_jsonl(path, labels_key)
            total = -(-len(texts) // batch_size) if batch_size else 1
            return Samples(
                lambda m: _raw_batches(texts, labels, m, pre, batch_size, limit, name), name, total
            )
        raise InputError(f"{path}: expected an .npz file, a .jsonl of texts or a folder")
    npz = sorted(p for p in path.iterdir() if p.is_file() and p.suffix == ".npz")
    if npz:
        return Samples(lambda m: _npz_files(npz, labels_key, limit), name, len(npz))
    files, labels, classes = _media(path)
    if not files:
        raise InputError(
            f"{path}: the data set is empty (no .npz, image or audio files, "
            "nor class subfolders with them)"
        )
    total = -(-len(files) // batch_size) if batch_size else 1
    return Samples(
        lambda m: _raw_batches(files, labels, m, pre, batch_size, limit, name),
        name,
        total,
        classes=classes,
    )


__all__ = [
    "AUDIO_SUFFIXES",
    "IMAGE_SUFFIXES",
    "Batch",
    "ImagePreprocess",
    "Samples",
    "declared_pre",
    "open_samples",
    "read_jsonl",
    "split_labels",
]
