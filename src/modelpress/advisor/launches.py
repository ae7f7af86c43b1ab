"""The kernels a pass launches: a workload's kernels as an engine runs them.

A compiled engine (TensorRT, ONNX Runtime) folds an elementwise op or a BatchNorm that follows a
kernel into that kernel's epilogue: no launch, no extra trip to memory, only its FLOPs (a
residual add still reads its second input). Eager passes (PyTorch op by op, training) launch
every op. Kernels of kind ``free`` (reshapes, views) launch nothing in either.
"""

from __future__ import annotations

from typing import NamedTuple

from modelpress.profile.workload import Kernel


class Launch(NamedTuple):
    """One launched kernel: FLOPs and activation elements per sample; weights per pass."""

    kind: str
    flops: float
    weights: float  # weight elements
    acts: float  # activation elements read and written, per sample
    out: float  # output elements, per sample
    cols: float  # output width of a matrix-like kernel (0: unknown)


def launches(kernels: tuple[Kernel, ...], *, fuse: bool) -> list[Launch]:
    """The kernels launched for ``kernels``, with the epilogue fusion of a compiled engine when
    ``fuse`` (module rule)."""
    rows: list[list] = []
    for k in kernels:
        if k.kind == "free":
            continue
        if fuse and k.fusable and rows:
            rows[-1][1] += k.flops
            rows[-1][3] += max(0.0, k.in_elems - k.out_elems)
            continue
        rows.append(
            [k.kind, k.flops, k.weight_elems, k.in_elems + k.out_elems, k.out_elems, k.out_cols]
        )
    return [Launch(*r) for r in rows]


__all__ = ["Launch", "launches"]
