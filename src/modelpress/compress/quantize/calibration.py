"""Calibration data: where it comes from, checking it against the model, and streaming it through
observers.

Sources (``CalibrationSet.from_source``):
- an ``.npz`` file whose arrays are named after the model's inputs, samples along axis 0 (sliced
  into batches); an extra array named by ``labels_key`` holds labels for an accuracy metric;
- a directory of ``.npz`` files, one batch each (shapes may differ from file to file);
- a directory of images with a declared ``ImagePreprocess`` (resize, centre crop, scale, normalise,
  layout), for a model with one image input (needs Pillow);
- any Python iterable of input dicts (a list, or a function returning a fresh iterator).

Every batch is checked against the model's inputs (names, dtypes, ranks, fixed sizes) with
``modelpress.verify.check_feeds``; the first bad batch raises one ``InputError`` naming the source.
An empty source is an error. Statistics are collected by running the model under ONNX Runtime
(graph optimizations disabled, so the tensors observed are the model's own) with the observed
tensors added as extra outputs; batches stream through and only the observers' fixed-size state
is kept.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np
import onnx_ir as ir

from modelpress.errors import InputError, OptionError
from modelpress.ir.feeds import check_feeds, load_npz
from modelpress.ir.graph import copy_model
from modelpress.ir.match import values_by_name
from modelpress.runtime.ort import session

# Batches of a one-shot iterator kept for the passes after calibration that read only a few: the
# four the measured bias correction averages over, and two more the check of the result runs on.
REPLAY = 6
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm", ".ppm"}

Progress = Callable[[int, int | None], None]  # (batches done, total batches or None)


@dataclass(frozen=True)
class ImagePreprocess:
    """How image files become the model's input: resize to ``size`` (H, W), centre-crop to ``crop``,
    multiply by ``scale``, subtract ``mean`` and divide by ``std`` (per channel), lay out as
    ``NCHW`` or ``NHWC``; ``mode`` is a Pillow mode (``RGB`` or ``L``)."""

    size: tuple[int, int] | None = None
    crop: tuple[int, int] | None = None
    scale: float = 1.0 / 255.0
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    layout: str = "NCHW"
    mode: str = "RGB"

    def __post_init__(self):
        if self.layout not in ("NCHW", "NHWC"):
            raise OptionError(f"image layout {self.layout!r}: choose NCHW or NHWC")

    def apply(self, path: Path) -> np.ndarray:
        from PIL import Image

        with Image.open(path) as img:
            img = img.convert(self.mode)
            if self.size is not None:
                img = img.resize((self.size[1], self.size[0]), Image.BILINEAR)
            if self.crop is not None:
                w, h = img.size
                ch, cw = self.crop
                if ch > h or cw > w:
                    raise InputError(
                        f"{path}: crop {ch}x{cw} is larger than the image ({h}x{w}); resize first"
                    )
                left, top = (w - cw) // 2, (h - ch) // 2
                img = img.crop((left, top, left + cw, top + ch))
            arr = np.asarray(img, dtype=np.float32)
        if arr.ndim == 2:
            arr = arr[:, :, None]
        arr = (arr * self.scale - np.asarray(self.mean, np.float32)) / np.asarray(
            self.std, np.float32
        )
        return arr.transpose(2, 0, 1) if self.layout == "NCHW" else arr


@dataclass
class Batch:
    feeds: dict[str, np.ndarray]
    labels: np.ndarray | None = None


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
        if isinstance(source, (str, os.PathLike)):
            return _from_path(
                Path(source), batch_size=batch_size, labels_key=labels_key, image=image, limit=limit
            )
        if callable(source):
            return cls(
                lambda m: _from_dicts(source(), labels_key), name="calibration data", total=None
            )
        if isinstance(source, dict):
            raise OptionError(
                "calibration data: pass a list of input dicts (or an .npz path), not one dict"
            )
        if isinstance(source, Iterable):
            once = iter(source) is source
            total = len(source) if hasattr(source, "__len__") else None
            return cls(
                lambda m: _from_dicts(source, labels_key),
                name="calibration data",
                total=total,
                once=once,
            )
        raise OptionError(
            f"calibration data of type {type(source).__name__}: pass a path or an iterable of input dicts"
        )

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


def _from_dicts(items: Iterable, labels_key: str | None) -> Iterator[Batch]:
    for item in items:
        if not isinstance(item, dict):
            raise InputError(
                f"calibration data: expected dicts of input arrays, got {type(item).__name__}"
            )
        feeds = {k: np.asarray(v) for k, v in item.items()}
        labels = feeds.pop(labels_key) if labels_key and labels_key in feeds else None
        yield Batch(feeds, labels)


def _split_labels(
    arrays: dict[str, np.ndarray], labels_key: str | None, source: str
) -> np.ndarray | None:
    if labels_key is None:
        return None
    if labels_key not in arrays:
        raise InputError(
            f"{source}: no array named {labels_key!r} (the labels key); arrays: {', '.join(arrays)}"
        )
    return arrays.pop(labels_key)


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


def _npz_batches(
    path: Path, batch_size: int, labels_key: str | None, limit: int | None, model: ir.Model
) -> Iterator[Batch]:
    arrays = load_npz(path)
    labels = _split_labels(arrays, labels_key, str(path))
    if not arrays:
        raise InputError(f"{path}: the calibration set is empty (no arrays)")
    axes = _sample_axes(model, arrays)
    counts = {k: v.shape[axes[k][0]] for k, v in arrays.items() if axes[k][0] is not None}
    if not counts:  # every array is fed whole: one sample
        counts = {k: 1 for k in arrays}
        axes = {k: (None, 0) for k in arrays}
    n = min(counts.values())
    if len(set(counts.values())) > 1:
        raise InputError(
            f"{path}: arrays have different numbers of samples along their batch axes: {counts}"
        )
    if labels is not None and labels.shape[:1] != (n,):
        raise InputError(
            f"{path}: labels {labels_key!r} have {labels.shape[:1]} entries, inputs have {n} samples"
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


def _dir_npz_batches(
    files: list[Path], labels_key: str | None, limit: int | None
) -> Iterator[Batch]:
    seen = 0
    for f in files:
        if limit is not None and seen >= limit:
            return
        arrays = load_npz(f)
        labels = _split_labels(arrays, labels_key, str(f))
        if not arrays:
            raise InputError(f"{f}: no input arrays")
        seen += next(iter(arrays.values())).shape[0] if next(iter(arrays.values())).ndim else 1
        yield Batch(arrays, labels)


def _image_batches(
    files: list[Path], image: ImagePreprocess, input_name: str, batch_size: int, limit: int | None
) -> Iterator[Batch]:
    if limit is not None:
        files = files[:limit]
    for start in range(0, len(files), batch_size):
        chunk = files[start : start + batch_size]
        try:
            arrays = [image.apply(f) for f in chunk]
        except OSError as exc:
            raise InputError(
                f"{chunk[0].parent}: cannot read an image: {str(exc).splitlines()[0][:200]}"
            ) from None
        shapes = {a.shape for a in arrays}
        if len(shapes) > 1:
            raise InputError(
                f"{chunk[0].parent}: images differ in size after pre-processing ({sorted(shapes)}); set a resize or crop"
            )
        yield Batch({input_name: np.stack(arrays)})


def _from_path(
    path: Path,
    *,
    batch_size: int,
    labels_key: str | None,
    image: ImagePreprocess | None,
    limit: int | None,
) -> CalibrationSet:
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if batch_size < 1:
        raise OptionError("`batch_size` must be at least 1")
    if path.is_file():
        if path.suffix != ".npz":
            raise InputError(f"{path}: calibration data must be an .npz file or a directory")
        return CalibrationSet(
            lambda m: _npz_batches(path, batch_size, labels_key, limit, m),
            name=str(path),
            total=None,
        )
    files = sorted(p for p in path.iterdir() if p.is_file())
    npz = [p for p in files if p.suffix == ".npz"]
    images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
    if npz:
        return CalibrationSet(
            lambda m: _dir_npz_batches(npz, labels_key, limit), name=str(path), total=len(npz)
        )
    if images:
        if image is None:
            raise OptionError(
                f"{path}: a folder of images needs a declared pre-processing (`image`: size, mean, std, layout)"
            )
        try:
            import PIL  # noqa: F401
        except ImportError:
            raise OptionError(
                f"{path}: reading images needs Pillow (`pip install pillow`); or convert them to an .npz"
            ) from None
        return CalibrationSet(
            lambda m: _image_batches(images, image, _single_input(m, path), batch_size, limit),
            name=str(path),
            total=-(-len(images) // batch_size),
        )
    raise InputError(f"{path}: the calibration set is empty (no .npz or image files)")


def _single_input(model: ir.Model, path: Path) -> str:
    inputs = [v.name for v in model.graph.inputs if v.name not in model.graph.initializers]
    if len(inputs) != 1:
        raise InputError(
            f"{path}: a folder of images feeds a model with one input; this one has {len(inputs)} ({', '.join(inputs)})"
        )
    return inputs[0]


def collect(
    model: ir.Model,
    cal: CalibrationSet,
    observers: dict[str, list],
    *,
    progress: Progress | None = None,
) -> int:
    """Run every calibration batch through ``model`` and give each observed tensor to its observers
    (anything with ``observe(x)``); returns the number of batches."""

    m = copy_model(model)
    graph_inputs = {v.name for v in m.graph.inputs}
    vals = values_by_name(m.graph)
    present = {v.name for v in m.graph.outputs}
    fetched = [n for n in observers if n not in graph_inputs]
    for name in fetched:
        if name not in present:
            v = vals[name]
            if v.type is None:
                v.type = ir.TensorType(ir.DataType.FLOAT)
            m.graph.outputs.append(v)
            present.add(name)
    sess = session(m, optimize="disabled")
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
