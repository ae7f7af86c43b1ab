"""ONNX Runtime's block-quantized weights (com.microsoft): MatMulNBits and GatherBlockQuantized.

The layouts are those ``modelpress.ir.nbits`` writes and documents: codes ``q`` unsigned, two
4-bit codes a byte (the even element in the low nibble), ``w = (q - z) * s`` per block of
``block_size`` along ``K`` (MatMulNBits) or along the row (GatherBlockQuantized), ``z`` absent
(``2**(bits-1)``), integer (packed like the codes, a row's odd last nibble padded) or float.
The dequantized weight is computed in float32 from the scales (and float zero points) as they
are, so a gradient reaches them: the codes stay constants.
"""

from __future__ import annotations

import torch

from modelpress.runtime.torch_backend.errors import UnsupportedOpError
from modelpress.runtime.torch_backend.registry import op

MS = "com.microsoft"


def _unpack(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """uint8 rows ``[R, bytes]`` → float codes ``[R, count]`` (unpacked in uint8: a weight's
    codes are the bulk of an LLM, converted once)."""
    rows = packed.reshape(packed.shape[0], -1)
    if bits == 4:
        rows = torch.stack([rows & 0x0F, rows >> 4], dim=-1).reshape(rows.shape[0], -1)
    return rows[:, :count].to(torch.float32)


def _zero_points(zp, bits: int, rows: int, n_blocks: int) -> torch.Tensor:
    if zp is None:
        return torch.full((rows, n_blocks), float(2 ** (bits - 1)))
    if zp.dtype.is_floating_point:
        return zp.reshape(rows, n_blocks).to(torch.float32)
    return _unpack(zp.reshape(rows, -1), bits, n_blocks)


@op("MatMulNBits", domain=MS)
def matmul_nbits(ctx, a, b, scales, zero_points=None, g_idx=None, bias=None):
    k, n = ctx.attr("K"), ctx.attr("N")
    bits, bs = ctx.attr("bits"), ctx.attr("block_size")
    if g_idx is not None and g_idx.numel():
        raise UnsupportedOpError(f"node {ctx.name!r}: MatMulNBits with g_idx")
    nb = -(-k // bs)
    q = _unpack(b.reshape(n, -1), bits, nb * bs).reshape(n, nb, bs)
    z = _zero_points(zero_points, bits, n, nb)
    w = ((q - z[..., None]) * scales.reshape(n, nb, 1).to(torch.float32)).reshape(n, -1)[:, :k]
    y = torch.matmul(a.to(torch.float32), w.T)
    return y if bias is None else y + bias


@op("GatherBlockQuantized", domain=MS)
def gather_block_quantized(ctx, data, indices, scales, zero_points=None):
    bits, bs = ctx.attr("bits", 4), ctx.attr("block_size", 128)
    if ctx.attr("gather_axis", 0) != 0 or ctx.attr("quantize_axis", 1) not in (1, -1):
        raise UnsupportedOpError(
            f"node {ctx.name!r}: GatherBlockQuantized other than rows of a row-blocked table"
        )
    rows = data.shape[0]
    nb = scales.shape[-1]
    idx = indices.to(torch.int64)
    idx = torch.where(idx < 0, idx + rows, idx).reshape(-1)
    q = _unpack(data[idx], bits, nb * bs).reshape(len(idx), nb, bs)
    z = _zero_points(zero_points, bits, rows, nb)[idx]
    w = (q - z[..., None]) * scales[idx].to(torch.float32)[..., None]
    return w.reshape(*indices.shape, nb * bs)
