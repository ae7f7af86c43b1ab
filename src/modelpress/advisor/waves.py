"""Wave quantisation of matrix-like kernels: how much of the device a GEMM's tiles keep busy.

A matrix-like kernel (GEMM, convolution as implicit GEMM, attention product) is cut into square
output tiles, one tile per streaming multiprocessor (compute unit) at a time. With T tiles on S
SMs the last wave is partly empty, so the kernel reaches T / (ceil(T / S) · S) of the device's
compute and its compute time divides by that. It matters at small batch (BERT-Large at batch 1: a
384 × 1024 output is 24 tiles of 128² on an A100's 108 SMs) and vanishes for large products.

Tiles: 128 × 128, the usual tensor-core GEMM tile at FP16/BF16/INT8/FP8, and 64 × 64, the
smaller one cuBLAS/CUTLASS/TensorRT fall back to for small outputs. The smaller tile reaches
half an SM's tensor rate (``TILE_EFFICIENCY``): a square tile of edge t does t/2 multiply-adds
per operand element it loads, so a 64² tile feeds the tensor cores twice the shared-memory and
L2 traffic per FLOP of a 128² one, and at these sizes the feed sets the pace. The library picks
the tile (and split, below) that gives the most work per unit of time, as its heuristic or
TensorRT's tactic timing would.

Split-K: an output with fewer tiles than SMs and a deep reduction is also cut along K, the
libraries' answer to a small output (cuBLAS and CUTLASS split-K, TensorRT's split-K tactics):
``s`` slices of every tile run on ``s`` SMs and their partial sums are added at the end. A slice
keeps at least ``SPLIT_K_MIN_DEPTH`` of the reduction (four main-loop steps of a 64-deep k-tile),
and no more slices are cut than fill one wave. It is what lets a batch-1 BERT-Base FFN output
(128 × 768, K = 3072: 6 tiles of 128², 12 slices of 256 each) keep 72 of an A100's 108 SMs
busy, not 6. The partial sums (a few hundred KB at these sizes) stay in the L2 cache and are
not charged.
"""

from __future__ import annotations

import math

# Output tile edges a tensor-core GEMM library chooses between, and the share of an SM's
# tensor rate each reaches (see the module docstring).
GEMM_TILES = (128, 64)
TILE_EFFICIENCY = {128: 1.0, 64: 0.5}
SPLIT_K_MIN_DEPTH = 256  # reduction elements a split-K slice keeps at least


def wave_utilisation(tiles: int, sm_count: float) -> float:
    """Fraction of the device a kernel of ``tiles`` output tiles keeps busy: tiles run one per SM
    in waves, and the last wave leaves ``ceil(tiles / SMs) · SMs - tiles`` SMs idle."""
    sms = int(sm_count)
    if tiles < 1 or sms < 1:
        raise ValueError(f"wave_utilisation needs tiles >= 1 and SMs >= 1, got {tiles}, {sm_count}")
    return tiles / (-(-tiles // sms) * sms)


def output_tiles(out_elems: float, out_cols: float, *, tile: int) -> int:
    """Output tiles of a matrix-like kernel whose output (all samples) is ``out_elems`` elements
    in rows of ``out_cols``: ceil(M / tile) · ceil(N / tile) with M = out_elems / out_cols."""
    rows = out_elems / out_cols
    return max(1, math.ceil(rows / tile - 1e-9)) * max(1, math.ceil(out_cols / tile - 1e-9))


def split_k(tiles: int, depth: float, sm_count: float) -> int:
    """Slices of the reduction (split-K) for a kernel of ``tiles`` output tiles over a reduction
    of ``depth`` elements: as many as fill one wave, each at least ``SPLIT_K_MIN_DEPTH`` deep."""
    if tiles >= sm_count:
        return 1
    return max(1, min(int(sm_count // tiles), int(depth // SPLIT_K_MIN_DEPTH)))


def gemm_utilisation(
    out_elems: float, out_cols: float, sm_count: float, *, depth: float = 0.0
) -> float:
    """Share of the device's tensor rate a matrix-like kernel reaches with the tile the library
    would pick: the one of ``GEMM_TILES`` whose wave utilisation × ``TILE_EFFICIENCY`` is the
    highest (the largest tile on a tie), its reduction of ``depth`` elements split as
    ``split_k`` says (0: unknown, no split)."""
    best = 0.0
    for tile in GEMM_TILES:
        tiles = output_tiles(out_elems, out_cols, tile=tile)
        util = wave_utilisation(tiles * split_k(tiles, depth, sm_count), sm_count)
        best = max(best, util * TILE_EFFICIENCY[tile])
    return best


__all__ = [
    "GEMM_TILES",
    "SPLIT_K_MIN_DEPTH",
    "gemm_utilisation",
    "output_tiles",
    "split_k",
    "wave_utilisation",
]
