"""Image pre-processing: encoded bytes (PNG, JPEG, also BMP and WebP) to one input tensor.

The steps, in order (the torchvision convention, so a model trained that way gets what it saw):

1. decode with Pillow and convert to ``color`` (``rgb``, ``bgr`` or ``gray``);
2. ``resize``: ``N`` scales the shorter side to N keeping the aspect ratio (the longer side is
   truncated to an integer), ``HxW`` scales to exactly that; ``interp`` picks Pillow's filter
   (``bilinear`` by default; Pillow antialiases when it shrinks);
3. ``crop``: the centre ``HxW`` (``N`` is square), top-left at ``round((h - H) / 2)``; an image
   smaller than the crop is padded with zeros around it;
4. ``x = pixels * scale`` then ``(x - mean) / std`` per channel, in float32 (``scale`` defaults
   to 1/255 for a float input, so ``mean``/``std`` are in [0, 1] units; an integer input takes
   the pixels as they are);
5. ``layout`` ``nchw`` or ``nhwc``, cast to ``dtype`` (the model input's by default).

Precondition for a declaration: the output size is fixed (``crop``, or ``resize=HxW``, or, when
neither is given, the model's own static height and width), so that items batch together.
"""

from __future__ import annotations

import io
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from modelpress.errors import InputError, require
from modelpress.runtime.processing.fields import (
    as_choice,
    as_float,
    as_floats,
    as_name,
    as_size,
    fail,
    read_item,
)
from modelpress.runtime.processing.signature import Tensor, one_input

INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "lanczos")
COLORS = ("rgb", "bgr", "gray")
LAYOUTS = ("nchw", "nhwc")
DTYPES = ("float32", "float16", "float64", "uint8", "int8")
FORMATS = ["PNG", "JPEG", "BMP", "WEBP"]
SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")  # the files of the formats decoded

KEYS = {
    "input": as_name,
    "resize": as_size,
    "crop": as_size,
    "interp": as_choice(INTERPOLATIONS),
    "color": as_choice(COLORS),
    "scale": as_float,
    "mean": as_floats,
    "std": as_floats,
    "layout": as_choice(LAYOUTS),
    "dtype": as_choice(DTYPES),
}


@dataclass(frozen=True)
class ImagePre:
    kind: ClassVar[str] = "image"
    input: str
    size: tuple[int, int]  # (H, W) of what the model receives
    resize: tuple[int, ...] | None
    crop: tuple[int, int] | None
    interp: str
    color: str
    scale: float
    mean: tuple[float, ...]
    std: tuple[float, ...]
    layout: str
    dtype: str

    # -- declaration ---------------------------------------------------------------------------
    @classmethod
    def declare(
        cls, raw: dict[str, Any], model_inputs: list[Tensor], *, base: Path | None = None
    ) -> ImagePre:
        """The declaration ``raw`` with its defaults taken from the model, checked against it."""
        f, target = one_input(raw, KEYS, model_inputs, kind="image")
        dims = target.dims
        if dims is not None and len(dims) != 4:
            raise fail(
                "pre.input", f"image pre-processing feeds a 4-D input, {target.describe()} is not"
            )
        layout = f.get("layout") or _guess_layout(dims)
        c_axis, h_axis, w_axis = (1, 2, 3) if layout == "nchw" else (3, 1, 2)
        model_c = dims[c_axis] if dims else None
        color = f.get("color") or ("gray" if model_c == 1 else "rgb")
        channels = 1 if color == "gray" else 3
        if model_c is not None and model_c != channels:
            raise fail(
                "pre.color" if "color" in f else "pre.layout",
                f"{color} gives {channels} channel(s) in {layout}, the model's input "
                f"{target.describe()} has {model_c}; set color= or layout= to match",
            )
        crop = f.get("crop")
        if crop is not None and len(crop) == 1:
            crop = (crop[0], crop[0])
        resize = f.get("resize")
        model_hw = (dims[h_axis], dims[w_axis]) if dims else (None, None)
        if crop is not None:
            size = crop
        elif resize is not None and len(resize) == 2:
            size = resize
        elif resize is None and None not in model_hw:
            size = resize = model_hw  # nothing said: scale to what the model takes
        else:
            raise fail(
                "pre.crop",
                "the output size is not fixed (resize=N keeps the aspect ratio); "
                "add crop=H[xW] or use resize=HxW so that images batch together",
            )
        for axis, got, want in (("height", size[0], model_hw[0]), ("width", size[1], model_hw[1])):
            if want is not None and got != want:
                raise fail(
                    "pre.crop" if crop is not None else "pre.resize",
                    f"gives images of {axis} {got}, the model's input {target.describe()} takes {want}",
                )
        dtype = f.get("dtype") or str(target.dtype)
        if dtype not in DTYPES:
            raise fail(
                "pre.dtype",
                f"the model's input {target.describe()} is not an image dtype ({', '.join(DTYPES)})",
            )
        if dtype != str(target.dtype):
            raise fail(
                "pre.dtype",
                f"{dtype} given, the model's input {target.describe()} takes {target.dtype}",
            )
        is_float = dtype.startswith("float")
        if not is_float and any(k in f for k in ("scale", "mean", "std")):
            key = next(k for k in ("scale", "mean", "std") if k in f)
            raise fail(f"pre.{key}", f"the model takes {dtype} pixels as they are; remove {key}=")
        mean = f.get("mean", (0.0,))
        std = f.get("std", (1.0,))
        for key, values in (("mean", mean), ("std", std)):
            if len(values) not in (1, channels):
                raise fail(
                    f"pre.{key}",
                    f"{len(values)} values given, give 1 or one per channel ({channels})",
                )
        if any(s == 0 for s in std):
            raise fail("pre.std", "must not be 0")
        return cls(
            input=target.name,
            size=tuple(size),
            resize=tuple(resize) if resize is not None else None,
            crop=tuple(crop) if crop is not None else None,
            interp=f.get("interp", "bilinear"),
            color=color,
            scale=f.get("scale", 1.0 / 255.0 if is_float else 1.0),
            mean=tuple(mean),
            std=tuple(std),
            layout=layout,
            dtype=dtype,
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("size")  # follows from resize and crop
        return {
            "kind": self.kind,
            **{k: list(v) if isinstance(v, tuple) else v for k, v in d.items() if v is not None},
        }

    @property
    def input_names(self) -> list[str]:
        return [self.input]

    @property
    def channels(self) -> int:
        return 1 if self.color == "gray" else 3

    # -- running -------------------------------------------------------------------------------
    def prepare(self, item: bytes | os.PathLike, *, label: str = "item") -> dict[str, np.ndarray]:
        """One item (encoded bytes, or a path to read them from) as the model input without its
        batch axis; an unreadable image raises InputError naming ``label``."""
        pixels = self.decode(item, label=label)
        return {self.input: self.transform(pixels)}

    def decode(self, item: bytes | os.PathLike, *, label: str = "item") -> np.ndarray:
        """Decoded, resized and cropped pixels, ``uint8`` (H, W, C)."""
        Image = require("PIL.Image", extra="image", purpose="image pre-processing")
        data = read_item(item, label=label, kind="image")
        try:
            with Image.open(io.BytesIO(data), formats=FORMATS) as img:
                img = img.convert("L" if self.color == "gray" else "RGB")
                if self.resize is not None:
                    img = img.resize(_resized(img.size, self.resize), _filter(Image, self.interp))
                pixels = np.asarray(img, dtype=np.uint8)
        except Image.UnidentifiedImageError:
            raise InputError(
                f"{label}: not a {', '.join(FORMATS[:-1])} or {FORMATS[-1]} image"
            ) from None
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
            msg = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            raise InputError(f"{label}: not a readable image ({msg})") from None
        if pixels.ndim == 2:
            pixels = pixels[:, :, None]
        if self.color == "bgr":
            pixels = pixels[:, :, ::-1]
        if self.crop is not None:
            pixels = center_crop(pixels, self.crop)
        return pixels

    def transform(self, pixels: np.ndarray) -> np.ndarray:
        """Scale, normalise, lay out and cast ``uint8`` (H, W, C) pixels."""
        if self.dtype.startswith("float"):
            x = pixels.astype(np.float32) * np.float32(self.scale)
            x = (x - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        else:
            x = pixels
        if self.layout == "nchw":
            x = x.transpose(2, 0, 1)
        return np.ascontiguousarray(x, dtype=self.dtype)

    def collate(self, prepared: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        return {self.input: np.stack([p[self.input] for p in prepared])}


def center_crop(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The centre ``size`` of (H, W, C) ``pixels``, padded with zeros where the image is smaller."""
    ch, cw = size
    h, w = pixels.shape[:2]
    if h < ch or w < cw:
        top, left = max(ch - h, 0) // 2, max(cw - w, 0) // 2
        padded = np.zeros((max(h, ch), max(w, cw), pixels.shape[2]), pixels.dtype)
        padded[top : top + h, left : left + w] = pixels
        pixels, h, w = padded, padded.shape[0], padded.shape[1]
    top = int(round((h - ch) / 2.0))
    left = int(round((w - cw) / 2.0))
    return pixels[top : top + ch, left : left + cw]


def _resized(size: tuple[int, int], resize: tuple[int, ...]) -> tuple[int, int]:
    """Pillow's (width, height) for ``resize`` of an image of ``size`` (width, height)."""
    w, h = size
    if len(resize) == 2:
        return resize[1], resize[0]
    n = resize[0]
    if w <= h:
        return n, max(int(n * h / w), 1)
    return max(int(n * w / h), 1), n


def _filter(Image, interp: str):
    return {
        "nearest": Image.Resampling.NEAREST,
        "bilinear": Image.Resampling.BILINEAR,
        "bicubic": Image.Resampling.BICUBIC,
        "lanczos": Image.Resampling.LANCZOS,
    }[interp]


def _guess_layout(dims: tuple[int | None, ...] | None) -> str:
    if dims and dims[3] in (1, 3) and dims[1] not in (1, 3):
        return "nhwc"
    return "nchw"
