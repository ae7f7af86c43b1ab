"""The kernels a pass launches: a workload's kernels as an engine runs them.

A compiled engine (TensorRT, ONNX Runtime) folds an elementwise op or a BatchNorm that follows a
kernel into that kernel's epilogue: no launch, no extra trip to memory, only its FLOPs (a
residual add still reads its second input). Eager passes (PyTorch op by op, training) launch
every op. Kernels of kind ``free`` (reshapes, views) launch nothing in either.

A reduction over rows (softmax) is not an epilogue: a GEMM's output tile holds part of each row,
so an engine without fused attention launches it as a kernel of its own (TensorRT's unfused
attention on Volta: a batched GEMM, a softmax kernel, a batched GEMM).

Fused attention (``attention=True``): on a device whose engine has fused multi-head attention
kernels, a compiled engine runs an encoder's attention core, scores = Q·Kᵀ, softmax, context =
P·V, as one kernel that keeps the scores on chip (TensorRT's fMHA plugin, FlashAttention): one
launch instead of two, and the B·heads·s² probabilities never go to memory; its reduction is not
split (a softmax row needs all of it), its tiles are those of the context product's output. The
softmax's exponentials and sums run on the vector units between the two products of each tile
(``Launch.vector_flops``, timed at the vector rate and added to the tensor time): the tensor
cores wait on them (FlashAttention-3's paper puts the H100's exponential rate at 3.9 TFLOPS
against 989 for FP16 matrix products; its Hopper-only kernels overlap the two, which this model
does not assume on any card). It is recognised by
its shape, a weightless matrix product (softmax folded in) followed by another, so a workload
need not name it. Which devices have such kernels is the catalog's architecture
(``fuses_attention``): TensorRT ships them for Turing (sm75) and later
(``plugin/bertQKVToContextPlugin``: sm75, sm80, sm86, sm87, sm90 kernels, none for Volta's sm70),
so on a V100 the same engine launches the core as two GEMMs (softmax fused into the first).
"""

from __future__ import annotations

from typing import NamedTuple

from modelpress.advisor.catalog import GPU
from modelpress.profile.workload import Kernel

# NVIDIA architectures with fused multi-head attention kernels in TensorRT (sm75 and later)
FUSED_ATTENTION_ARCHITECTURES = ("Turing", "Ampere", "Ada Lovelace", "Hopper", "Blackwell")


class Launch(NamedTuple):
    """One launched kernel: FLOPs and activation elements per sample; weights per pass."""

    kind: str
    flops: float
    weights: float  # weight elements
    acts: float  # activation elements read and written, per sample
    out: float  # output elements, per sample
    cols: float  # output width of a matrix-like kernel (0: unknown)
    split_k: bool = True  # may the library split its reduction (not a fused softmax's rows)
    vector_flops: float = 0.0  # FLOPs on the vector units, not overlapped with the tensor work


def fuses_attention(gpu: GPU) -> bool:
    """Whether a compiled engine on ``gpu`` runs attention as one fused kernel (module rule)."""
    return gpu.vendor == "NVIDIA" and gpu.architecture.startswith(FUSED_ATTENTION_ARCHITECTURES)


def _product(k: Kernel) -> bool:
    return k.kind == "matmul" and not k.weight_elems


def launches(kernels: tuple[Kernel, ...], *, fuse: bool, attention: bool = False) -> list[Launch]:
    """The kernels launched for ``kernels``, with the epilogue fusion of a compiled engine when
    ``fuse`` and its fused attention when ``attention`` too (module rule)."""
    rows: list[list] = []
    last: Kernel | None = None  # the kernel that opened the last row
    for k in kernels:
        if k.kind == "free":
            continue
        # a row reduction (softmax) needs whole rows, which a GEMM tile does not hold: it folds
        # only into a fused attention kernel
        into_attention = attention and last is not None and _product(last)
        if fuse and k.kind == "reduce" and k.fusable and rows and into_attention:
            rows[-1][7] += k.flops  # the softmax's exponentials, on the vector units
            continue
        if fuse and k.fusable and rows and k.kind != "reduce":
            rows[-1][1] += k.flops
            rows[-1][3] += max(0.0, k.in_elems - k.out_elems)
            continue
        if fuse and attention and rows and last is not None and _product(last) and _product(k):
            # scores (softmax folded in) and context in one kernel: the probabilities stay on
            # chip, neither written by the first product nor read by the second
            row = rows[-1]
            row[1] += k.flops
            row[3] += k.in_elems + k.out_elems - 2 * row[4]
            row[4], row[5] = k.out_elems, k.out_cols
            row[6] = False  # each softmax row needs its whole reduction: no split-K
            last = None
            continue
        rows.append(
            [
                k.kind,
                k.flops,
                k.weight_elems,
                k.in_elems + k.out_elems,
                k.out_elems,
                k.out_cols,
                True,
                0.0,
            ]
        )
        last = k
    return [Launch(*r) for r in rows]


__all__ = ["FUSED_ATTENTION_ARCHITECTURES", "Launch", "fuses_attention", "launches"]
