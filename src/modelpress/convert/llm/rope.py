"""Rotary position embedding: the inverse frequencies of each rope type, as transformers computes them.

The graph computes ``angle = position_id * inv_freq`` per token and takes ``cos``/``sin`` of it
(times ``attention_scaling``), so any position works and no table of ``max_context`` rows is stored.
The frequencies are computed in float32 the way transformers' ``ROPE_INIT_FUNCTIONS`` do, so the
angles match its own to the last bit.

Types: ``default``, ``linear`` (positions divided by ``factor``), ``llama3`` (Llama 3.1's
frequency-dependent scaling), ``longrope`` (Phi-3's short and long factors: the graph picks the long
ones when the longest position reaches ``original_max_position_embeddings``). Others are refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from modelpress.errors import ConversionError


@dataclass(frozen=True)
class Rope:
    """The rotary embedding of one kind of layer."""

    inv_freq: np.ndarray  # float32 [rotary_dim // 2]
    attention_scaling: float = 1.0
    # longrope: the frequencies used once a position reaches ``long_from`` (None: one set only)
    long_inv_freq: np.ndarray | None = None
    long_from: int = 0

    def key(self) -> tuple:
        long = None if self.long_inv_freq is None else self.long_inv_freq.tobytes()
        return (self.inv_freq.tobytes(), self.attention_scaling, long, self.long_from)


def _base_inv_freq(base: float, dim: int) -> np.ndarray:
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    return (np.float32(1.0) / (np.float32(base) ** exponents)).astype(np.float32)


def _default(params: dict, dim: int, max_pos: int) -> Rope:
    return Rope(_base_inv_freq(params["rope_theta"], dim))


def _linear(params: dict, dim: int, max_pos: int) -> Rope:
    inv = _base_inv_freq(params["rope_theta"], dim) / np.float32(params["factor"])
    return Rope(inv.astype(np.float32))


def _llama3(params: dict, dim: int, max_pos: int) -> Rope:
    inv = _base_inv_freq(params["rope_theta"], dim)
    factor = params["factor"]
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    old_context = params["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return Rope(np.where(medium, smoothed, scaled).astype(np.float32))


def _longrope(params: dict, dim: int, max_pos: int) -> Rope:
    original = params.get("original_max_position_embeddings") or max_pos
    factor = params.get("factor") or max_pos / original
    scaling = params.get("attention_factor")
    if scaling is None:
        scaling = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    base = np.float32(params["rope_theta"]) ** exponents

    def inv(factors) -> np.ndarray:
        ext = np.asarray(factors, dtype=np.float32)
        return (np.float32(1.0) / (ext * base)).astype(np.float32)

    return Rope(inv(params["short_factor"]), scaling, inv(params["long_factor"]), int(original))


ROPE_TYPES = {"default": _default, "linear": _linear, "llama3": _llama3, "longrope": _longrope}


def rope_from_params(params: dict, *, dim: int, max_pos: int, where: str) -> Rope:
    """The ``Rope`` of transformers' ``rope_parameters`` (``rope_type``, ``rope_theta``, ...)."""
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind == "su":  # Phi-3's early name for longrope
        kind = "longrope"
    if kind not in ROPE_TYPES:
        raise ConversionError(
            f"{where}: rope type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})"
        )
    return ROPE_TYPES[kind](params, dim, max_pos)
