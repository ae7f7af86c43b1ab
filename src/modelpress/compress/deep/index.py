"""Where a sparse tensor's kept weights are: relative positions or a bitmask, whichever is smaller.

Both list the kept positions of the flattened (row-major) tensor:

- ``gaps``: one byte per kept weight, its distance from the previous one (the first counts from
  -1), as Han et al. store relative indices. A distance over 255 is written as zero bytes, each
  stepping over 255 positions, then the remainder: the code stream never holds filler entries.
  Small when few weights are kept (a gap's entropy grows only as the log of the sparsity);
- ``masks``: one bit per weight (``numpy.packbits``, most significant bit first), the tensor's
  size / 8 bytes whatever the sparsity. Smaller when many weights are kept: gaps of 1 and 2 still
  cost a byte each before entropy coding and about a bit each after.

``encode`` measures both with the caller's coder (``cost``: bytes in, coded length out) and keeps
the smaller; the entry records which (``"index"``) and the stream's length (``"index_bytes"``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

KINDS = ("gaps", "masks")
MAX_GAP = 255


def gaps(mask: np.ndarray) -> bytes:
    positions = np.flatnonzero(mask.reshape(-1))
    steps = np.diff(positions, prepend=-1)
    skips = (steps - 1) // MAX_GAP  # zero bytes ahead of each kept weight
    rest = steps - skips * MAX_GAP
    out = np.zeros(int(skips.sum()) + steps.size, np.uint8)
    out[np.cumsum(skips + 1) - 1] = rest  # every other byte stays a zero (a skip)
    return out.tobytes()


def encode(mask: np.ndarray, cost: Callable[[bytes], int]) -> tuple[str, bytes]:
    """``(kind, stream)``: the smaller way to store ``mask``'s kept positions under ``cost``."""
    candidates = {"gaps": gaps(mask), "masks": np.packbits(mask.reshape(-1)).tobytes()}
    kind = min(KINDS, key=lambda k: (cost(candidates[k]), len(candidates[k])))
    return kind, candidates[kind]


def decode(kind: str, stream: bytes, *, size: int, kept: int) -> np.ndarray:
    """The kept positions (int64, increasing) of a tensor of ``size`` weights, ``kept`` of them."""
    data = np.frombuffer(stream, np.uint8)
    if kind == "masks":
        if data.size != (size + 7) // 8:
            raise ValueError(f"a bitmask of {data.size} bytes for {size} weights")
        positions = np.flatnonzero(np.unpackbits(data, count=size))
    elif kind == "gaps":
        steps = np.where(data == 0, MAX_GAP, data).astype(np.int64)
        positions = (np.cumsum(steps) - 1)[data != 0]
        if data.size and data[-1] == 0:
            raise ValueError("a gap stream that ends in a skip")
    else:
        raise ValueError(f"unknown index kind {kind!r}")
    if positions.size != kept or (positions.size and positions[-1] >= size):
        raise ValueError(
            f"{positions.size} kept positions for {kept} weights in a tensor of {size}"
        )
    return positions
