"""Audio pre-processing: a WAV file or raw PCM bytes to float samples, optionally in frames.

Samples become float32 in [-1, 1): unsigned 8-bit as ``(x - 128) / 128``, signed n-bit as
``x / 2**(n-1)``, float as it is. Several channels are averaged to one when ``channels=1``. The
signal is cut or padded with zeros at the end to ``length`` samples; with ``frame`` (and ``hop``,
``frame`` by default) it is cut into ``1 + (length - frame) // hop`` overlapping frames.

What the model receives, by the rank of its input: ``(batch, length)`` or ``(batch, channels,
length)``; with frames ``(batch, frames, frame)`` or ``(batch, channels, frames, frame)``.
``format=wav`` reads the file's header (PCM 8/16/24/32-bit, float 32/64-bit, also in the
extensible format) and refuses a sample rate other than ``rate`` when one is declared: this step
does not resample. Raw bytes are ``s16le``, ``s32le``, ``f32le`` or ``u8``, channels interleaved.
"""

from __future__ import annotations

import os
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from modelpress.errors import InputError
from modelpress.runtime.processing.fields import (
    as_choice,
    as_int,
    as_name,
    fail,
    read_item,
)
from modelpress.runtime.processing.signature import Tensor, one_input

FORMATS = ("wav", "s16le", "s32le", "f32le", "u8")
SUFFIXES = (".wav", ".pcm", ".raw")
KEYS = {
    "input": as_name,
    "format": as_choice(FORMATS),
    "rate": as_int,
    "channels": as_int,
    "length": as_int,
    "frame": as_int,
    "hop": as_int,
}
_RAW = {"s16le": ("<i2", 2**15), "s32le": ("<i4", 2**31), "f32le": ("<f4", 1), "u8": ("u1", 1)}


@dataclass(frozen=True)
class AudioPre:
    kind: ClassVar[str] = "audio"
    input: str
    format: str
    rate: int | None
    channels: int
    length: int
    frame: int | None
    hop: int | None
    dtype: str  # the model's (float) input dtype
    channel_axis: bool  # whether the model's input has a channels axis

    @classmethod
    def declare(
        cls, raw: dict[str, Any], model_inputs: list[Tensor], *, base: Path | None = None
    ) -> AudioPre:
        f, target = one_input(raw, KEYS, model_inputs, kind="audio")
        if target.dtype.kind != "f":
            raise fail(
                "pre.input",
                f"audio pre-processing gives float samples, {target.describe()} is not float",
            )
        frame, hop = f.get("frame"), f.get("hop")
        if hop is not None and frame is None:
            raise fail("pre.hop", "hop= needs frame=")
        hop = hop or frame
        ranks = (3, 4) if frame else (2, 3)
        dims = target.dims
        if dims is not None and len(dims) not in ranks:
            shapes = (
                "(batch, frames, frame) or (batch, channels, frames, frame)"
                if frame
                else "(batch, length) or (batch, channels, length)"
            )
            raise fail(
                "pre.input", f"audio feeds {shapes}, the model's input is {target.describe()}"
            )
        has_channels = dims is not None and len(dims) == ranks[1]
        model_c = dims[1] if has_channels else (1 if dims is not None else None)
        channels = f.get("channels") or model_c or 1
        if model_c is not None and channels != model_c:
            raise fail(
                "pre.channels",
                f"{channels} given, the model's input {target.describe()} takes {model_c}",
            )
        length = f.get("length")
        if frame:
            model_frame, model_frames = (dims[-1], dims[-2]) if dims else (None, None)
            if model_frame is not None and frame != model_frame:
                raise fail(
                    "pre.frame",
                    f"{frame} given, the model's input {target.describe()} takes frames of {model_frame}",
                )
            if length is None and model_frames is not None:
                length = frame + hop * (model_frames - 1)
            if length is not None and length < frame:
                raise fail("pre.length", f"{length} samples hold no frame of {frame}")
            if (
                length is not None
                and model_frames is not None
                and 1 + (length - frame) // hop != model_frames
            ):
                raise fail(
                    "pre.length",
                    f"{length} samples give {1 + (length - frame) // hop} frames, the model takes {model_frames}",
                )
        else:
            model_length = dims[-1] if dims else None
            if length is None:
                length = model_length
            if model_length is not None and length != model_length:
                raise fail(
                    "pre.length",
                    f"{length} given, the model's input {target.describe()} takes {model_length} samples",
                )
        if length is None:
            raise fail(
                "pre.length",
                f"the model's input {target.describe()} takes any length; give length=SAMPLES so that items batch together",
            )
        return cls(
            input=target.name,
            format=f.get("format", "wav"),
            rate=f.get("rate"),
            channels=channels,
            length=length,
            frame=frame,
            hop=hop,
            dtype=str(target.dtype),
            channel_axis=has_channels,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            **{
                k: v
                for k, v in asdict(self).items()
                if v is not None and k not in ("dtype", "channel_axis")
            },
        }

    @property
    def input_names(self) -> list[str]:
        return [self.input]

    def prepare(self, item: bytes | os.PathLike, *, label: str = "item") -> dict[str, np.ndarray]:
        data = read_item(item, label=label, kind="audio")
        if self.format == "wav":
            samples, rate = read_wav(data, label=label)
            if self.rate is not None and rate != self.rate:
                raise InputError(
                    f"{label}: sampled at {rate} Hz, the model's declaration (pre.rate) says {self.rate}"
                )
        else:
            samples = decode_pcm(data, self.format, self.channels, label=label)
        if samples.shape[1] != self.channels:
            if self.channels != 1:
                raise InputError(
                    f"{label}: {samples.shape[1]} channel(s), the model takes {self.channels}"
                )
            samples = samples.mean(axis=1, keepdims=True, dtype=np.float32)
        x = np.zeros((self.channels, self.length), np.float32)
        n = min(self.length, samples.shape[0])
        x[:, :n] = samples[:n].T
        if self.frame:
            x = np.lib.stride_tricks.sliding_window_view(x, self.frame, axis=-1)[:, :: self.hop]
        if not self.channel_axis:
            x = x[0]
        return {self.input: np.ascontiguousarray(x, dtype=self.dtype)}

    def collate(self, prepared: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        return {self.input: np.stack([p[self.input] for p in prepared])}


def decode_pcm(data: bytes, fmt: str, channels: int, *, label: str = "item") -> np.ndarray:
    """Interleaved raw samples as float32 (frames, channels)."""
    dtype, full = _RAW[fmt]
    width = np.dtype(dtype).itemsize * channels
    if len(data) % width:
        raise InputError(
            f"{label}: {len(data)} bytes is not a whole number of {fmt} frames of {channels} channel(s)"
        )
    x = np.frombuffer(data, dtype=dtype).reshape(-1, channels)
    if fmt == "u8":
        return (x.astype(np.float32) - 128) / 128
    return x.astype(np.float32) / np.float32(full)


def read_wav(data: bytes, *, label: str = "item") -> tuple[np.ndarray, int]:
    """Samples as float32 (frames, channels) and the sample rate of a RIFF/WAVE file."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise InputError(f"{label}: not a WAV file (no RIFF/WAVE header)")
    fmt = None
    pos = 12
    while pos + 8 <= len(data):
        chunk, size = data[pos : pos + 4], struct.unpack("<I", data[pos + 4 : pos + 8])[0]
        body = data[pos + 8 : pos + 8 + size]
        if chunk == b"fmt " and len(body) >= 16:
            tag, channels, rate, _, _, bits = struct.unpack("<HHIIHH", body[:16])
            if (
                tag == 0xFFFE and len(body) >= 26
            ):  # WAVE_FORMAT_EXTENSIBLE: the real tag opens the sub-format GUID
                tag = struct.unpack("<H", body[24:26])[0]
            fmt = (tag, channels, rate, bits)
        elif chunk == b"data" and fmt is not None:
            return _wav_samples(body, *fmt, label=label), fmt[2]
        pos += 8 + size + (size & 1)  # chunks are padded to an even size
    raise InputError(
        f"{label}: WAV file without {'a fmt' if fmt is None else 'a data'} chunk (truncated?)"
    )


def _wav_samples(
    body: bytes, tag: int, channels: int, rate: int, bits: int, *, label: str
) -> np.ndarray:
    if channels < 1 or rate < 1:
        raise InputError(f"{label}: WAV header declares {channels} channels at {rate} Hz")
    width = bits // 8
    body = body[: len(body) - len(body) % (width * channels)] if width else b""
    if tag == 1 and bits in (8, 16, 32):
        fmt = {8: "u8", 16: "s16le", 32: "s32le"}[bits]
        return decode_pcm(body, fmt, channels, label=label)
    if tag == 1 and bits == 24:
        raw = np.frombuffer(body, np.uint8).reshape(-1, 3).astype(np.int32)
        x = raw[:, 0] | (raw[:, 1] << 8) | (raw[:, 2] << 16)
        x = np.where(x >= 2**23, x - 2**24, x)
        return (x.astype(np.float32) / np.float32(2**23)).reshape(-1, channels)
    if tag == 3 and bits in (32, 64):
        return (
            np.frombuffer(body, "<f4" if bits == 32 else "<f8")
            .astype(np.float32)
            .reshape(-1, channels)
        )
    raise InputError(
        f"{label}: WAV encoding {tag} with {bits}-bit samples is not supported (use PCM or float)"
    )
