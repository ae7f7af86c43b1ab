"""Matrix products: MatMul (numpy semantics, incl. 1-D operands), Gemm, Einsum, Det, MatMulInteger.

Integer products are computed in int64 (exact) and returned as int32, as ONNX specifies.
"""

from __future__ import annotations

import torch

from modelpress.runtime.torch_backend.registry import op


@op("MatMul")
def matmul(ctx, a, b):
    if not a.dtype.is_floating_point:
        return torch.matmul(a.to(torch.int64), b.to(torch.int64)).to(a.dtype)
    return torch.matmul(a, b)


@op("Gemm")
def gemm(ctx, a, b, c=None):
    if ctx.attr("transA", 0):
        a = a.transpose(0, 1)
    if ctx.attr("transB", 0):
        b = b.transpose(0, 1)
    alpha = ctx.attr("alpha", 1.0)
    beta = ctx.attr("beta", 1.0)
    y = a @ b
    if alpha != 1.0:
        y = alpha * y
    if c is not None:
        y = y + (c if beta == 1.0 else beta * c)
    return y


@op("Einsum")
def einsum(ctx, *xs):
    return torch.einsum(ctx.attr("equation").replace(" ", ""), *xs)


@op("Det")
def det(ctx, x):
    return torch.linalg.det(x)


def _centered(x, zp):
    x = x.to(torch.int64)
    if zp is None:
        return x
    zp = zp.to(torch.int64)
    # a per-row (for A) or per-column (for B) zero point
    return x - zp


@op("MatMulInteger")
def matmul_integer(ctx, a, b, a_zero=None, b_zero=None):
    a = _centered(
        a,
        None
        if a_zero is None
        else (a_zero.reshape(-1, 1) if a_zero.dim() == 1 and a_zero.numel() > 1 else a_zero),
    )
    b = _centered(b, b_zero)
    if a.device.type == "cuda":
        # CUDA has no integer matmul for int64; float64 holds every product and sum exactly
        # (8-bit operands: |sum| < 2^17 * K, far below 2^53)
        return torch.matmul(a.double(), b.double()).to(torch.int32)
    if a.device.type != "cpu":  # MPS: neither int64 products nor float64
        return torch.matmul(a.cpu(), b.cpu()).to(device=a.device, dtype=torch.int32)
    return torch.matmul(a, b).to(torch.int32)
