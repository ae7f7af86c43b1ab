"""Block-quantized weights: the format, and the ONNX nodes that read it.

A weight ``W [K, N]`` of ``y = x @ W`` is stored per output column ``n`` in blocks of
``block_size`` consecutive elements along ``K``: each block has one scale ``s`` and one zero point
``z``, and an element with the unsigned code ``q`` (``0 ≤ q < 2**bits``) stands for::

    w = (q - z) * s

``Blocks`` holds that in the orientation of ONNX Runtime's ``MatMulNBits`` (com.microsoft): codes
``[N, K]``, scales and zero points ``[N, n_blocks]``, ``n_blocks = ceil(K / block_size)``. The
zero point is either absent (it is then ``2**(bits-1)``: 8 for 4 bits, 128 for 8 bits, the
symmetric grid), integer codes (``uint8``), or float (the scales' type; GGUF's Q4_1 ``w = d*q + m``
is ``s = d``, ``z = -m/d``).

Written three ways, all checked against ONNX Runtime 1.32's CPU kernels (tests/ir/test_nbits.py):

- ``MatMulNBits`` (``matmul_nbits``): ``B`` uint8 ``[N, n_blocks, block_size*bits/8]`` with two
  4-bit codes a byte, the even element in the low nibble; ``scales`` ``[N*n_blocks]``;
  ``zero_points`` uint8 packed the same way per row (``[N * ceil(n_blocks*bits/8)]``, a row's
  odd last nibble padded). ``K`` need not be a multiple of ``block_size``: the last block is
  padded (its padding is never read). The CPU kernel takes 4 and 8 bits.
- standard ONNX (``dq_matmul``): ``DequantizeLinear`` with ``axis=0`` and ``block_size`` (opset
  21) on codes ``[K, N]`` of type int4 (symmetric 4 bits: ``q - 8``, no zero point), uint4 with
  uint4 zero points, int8 or uint8 likewise; then ``MatMul`` (which ONNX Runtime fuses into the
  ``MatMulNBits`` kernel).

Float zero points are written in neither kernel's own zero-point input: ONNX Runtime 1.32 takes
them in ``MatMulNBits`` but only on a slow path (about 150x slower than integer zero points on a
576x1536 weight, one thread, at accuracy level 0 or 4) and refuses them for 8 bits;
``DequantizeLinear`` has no float zero point at all. Since ``w = q*s - z*s``, both forms compute
instead ``x @ (q*s)`` (the codes with integer zero point 0, the fast kernel) plus the blocks'
offsets ``x @ (I_blocks @ O)``: ``I_blocks [K, n_blocks]`` sums ``x`` over each block and
``O [n_blocks, N] = -z*s``, two small float ``MatMul`` s (1/block_size of the weight's size).
- embeddings (``gather_block_quantized``): a table ``T [V, D]`` is ``Blocks`` with ``N = V`` and
  ``K = D`` (a row's blocks run along ``D``); ONNX Runtime's ``GatherBlockQuantized``
  (com.microsoft; uint8 data ``[V, D*bits/8]``, ``bits`` 4 or 8, ``quantize_axis=1``, integer zero
  points packed as above) gathers rows and dequantizes them. Its standard form is
  ``DequantizeLinear(axis=1, block_size)`` then ``Gather``.

Because the same ``Blocks`` describe a tied embedding table ``[V, D]`` and its LM head
``W = Tᵀ [D, V]``, one quantization serves both.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx_ir as ir

from modelpress.errors import OptionError
from modelpress.ir.graph import unique_name

MS_DOMAIN = "com.microsoft"
BITS = (4, 8)
STANDARD_OPSET = 21  # DequantizeLinear's block_size and the 4-bit types


@dataclass(frozen=True)
class Blocks:
    """A block-quantized ``W [K, N]`` in ``MatMulNBits`` orientation (module docstring).

    ``codes`` uint8 ``[N, K]`` (unsigned, ``< 2**bits``), ``scales`` float32 ``[N, n_blocks]``,
    ``zero_points`` ``None``, uint8 ``[N, n_blocks]`` or float32 ``[N, n_blocks]``.
    """

    codes: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    bits: int
    block_size: int

    def __post_init__(self) -> None:
        if self.bits not in BITS:
            raise OptionError(f"`bits` must be one of {BITS}, got {self.bits}")
        bs = self.block_size
        if bs < 16 or bs & (bs - 1):
            raise OptionError(f"`block_size` must be a power of two ≥ 16, got {bs}")
        n, k = self.codes.shape
        nb = -(-k // bs)
        if self.scales.shape != (n, nb):
            raise ValueError(f"scales {self.scales.shape} do not fit codes {self.codes.shape}")
        if self.zero_points is not None and self.zero_points.shape != (n, nb):
            raise ValueError(
                f"zero points {self.zero_points.shape} do not fit codes {self.codes.shape}"
            )

    @property
    def k(self) -> int:
        return self.codes.shape[1]

    @property
    def n(self) -> int:
        return self.codes.shape[0]

    @property
    def n_blocks(self) -> int:
        return self.scales.shape[1]

    @property
    def float_zero_points(self) -> bool:
        return self.zero_points is not None and self.zero_points.dtype.kind == "f"

    def zero_point_values(self) -> np.ndarray:
        """The zero points as float32 ``[N, n_blocks]`` (the implicit ``2**(bits-1)`` included)."""
        if self.zero_points is None:
            return np.full(self.scales.shape, 2 ** (self.bits - 1), np.float32)
        return self.zero_points.astype(np.float32)

    def dequantize(self) -> np.ndarray:
        """``W [K, N]`` float32, as the kernels compute it."""
        n, k = self.codes.shape
        bs, nb = self.block_size, self.n_blocks
        q = np.zeros((n, nb * bs), np.float32)
        q[:, :k] = self.codes
        w = (q.reshape(n, nb, bs) - self.zero_point_values()[:, :, None]) * self.scales[:, :, None]
        return np.ascontiguousarray(w.reshape(n, nb * bs)[:, :k].T, dtype=np.float32)

    def nbytes(self) -> int:
        """Bytes of the stored form (packed codes, scales, zero points)."""
        zp = 0 if self.zero_points is None else self.zero_points.size
        if self.zero_points is not None:
            zp *= 4 if self.float_zero_points else self.bits / 8
        return int(
            self.n * self.n_blocks * self.block_size * self.bits / 8 + self.scales.nbytes + zp
        )


def pack_codes(codes: np.ndarray, bits: int, block_size: int) -> np.ndarray:
    """``[N, K]`` codes → ``MatMulNBits``'s ``B``: uint8 ``[N, n_blocks, block_size*bits/8]``."""
    n, k = codes.shape
    nb = -(-k // block_size)
    q = np.zeros((n, nb * block_size), np.uint8)
    q[:, :k] = codes
    if bits == 4:
        q = q[:, 0::2] | (q[:, 1::2] << 4)
    return np.ascontiguousarray(q.reshape(n, nb, block_size * bits // 8))


def unpack_codes(packed: np.ndarray, bits: int, k: int) -> np.ndarray:
    """The inverse of ``pack_codes``: uint8 ``[N, K]``."""
    n = packed.shape[0]
    flat = packed.reshape(n, -1)
    if bits == 4:
        out = np.empty((n, flat.shape[1] * 2), np.uint8)
        out[:, 0::2], out[:, 1::2] = flat & 0x0F, flat >> 4
        flat = out
    return np.ascontiguousarray(flat[:, :k])


def pack_nibbles(values: np.ndarray) -> np.ndarray:
    """uint8 ``[R, C]`` values < 16 → uint8 ``[R, ceil(C/2)]``, the even column in the low nibble."""
    r, c = values.shape
    v = np.zeros((r, c + c % 2), np.uint8)
    v[:, :c] = values
    return np.ascontiguousarray(v[:, 0::2] | (v[:, 1::2] << 4))


def unpack_nibbles(packed: np.ndarray, columns: int) -> np.ndarray:
    out = np.empty((packed.shape[0], packed.shape[1] * 2), np.uint8)
    out[:, 0::2], out[:, 1::2] = packed & 0x0F, packed >> 4
    return np.ascontiguousarray(out[:, :columns])


def pack_zero_points(zero_points: np.ndarray, bits: int) -> np.ndarray:
    """Integer zero points ``[N, n_blocks]`` → ``MatMulNBits``'s flat uint8 form."""
    zp = zero_points.astype(np.uint8)
    return (pack_nibbles(zp) if bits == 4 else zp).reshape(-1)


def unpack_zero_points(packed: np.ndarray, bits: int, n: int, n_blocks: int) -> np.ndarray:
    rows = packed.reshape(n, -1)
    return unpack_nibbles(rows, n_blocks) if bits == 4 else np.ascontiguousarray(rows[:, :n_blocks])


def _initializer(graph: ir.Graph, array: np.ndarray, hint: str, dtype=None) -> ir.Value:
    name = unique_name(graph, hint)
    tensor = ir.tensor(array, dtype=dtype, name=name)
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype))
    value.const_value = tensor
    graph.register_initializer(value)
    return value


def _out(node: ir.Node, graph: ir.Graph, hint: str) -> ir.Value:
    out = node.outputs[0]
    out.name = unique_name(graph, hint)
    out.type = ir.TensorType(ir.DataType.FLOAT)
    return out


def matmul_nbits(
    graph: ir.Graph, x: ir.Value, blocks: Blocks, *, name: str, accuracy_level: int = 0
) -> tuple[list[ir.Node], ir.Value]:
    """``MatMulNBits(x, blocks)``: the new node (its initializers registered in ``graph``) and
    its output value. ``accuracy_level`` 4 lets the CPU kernel quantize ``x`` to int8 per block
    (faster, a little less exact); 0 computes in float."""
    if blocks.float_zero_points:
        return _with_offsets(
            graph,
            x,
            blocks,
            name,
            lambda b: matmul_nbits(graph, x, b, name=name, accuracy_level=accuracy_level),
        )
    inputs = [
        x,
        _initializer(graph, pack_codes(blocks.codes, blocks.bits, blocks.block_size), f"{name}.B"),
        _initializer(graph, blocks.scales.reshape(-1).astype(np.float32), f"{name}.scales"),
    ]
    if blocks.zero_points is not None:
        zp = pack_zero_points(blocks.zero_points, blocks.bits)
        inputs.append(_initializer(graph, zp, f"{name}.zero_points"))
    node = ir.node(
        "MatMulNBits",
        inputs,
        attributes={
            "K": blocks.k,
            "N": blocks.n,
            "bits": blocks.bits,
            "block_size": blocks.block_size,
            "accuracy_level": accuracy_level,
        },
        domain=MS_DOMAIN,
        name=unique_name(graph, name),
    )
    return [node], _out(node, graph, f"{name}.out")


def _dq_codes(blocks: Blocks) -> tuple[np.ndarray, np.ndarray | None, ir.DataType]:
    """Codes (and integer zero points) in the ``DequantizeLinear`` type of ``blocks``: signed
    without zero points (``q - 2**(bits-1)``), unsigned with them."""
    signed = blocks.zero_points is None
    if blocks.bits == 4:
        dtype = ir.DataType.INT4 if signed else ir.DataType.UINT4
        np_dtype = ml_dtypes.int4 if signed else ml_dtypes.uint4
    else:
        dtype = ir.DataType.INT8 if signed else ir.DataType.UINT8
        np_dtype = np.int8 if signed else np.uint8
    codes = blocks.codes.astype(np.int16)
    if signed:
        codes = codes - 2 ** (blocks.bits - 1)
    zp = None if signed else blocks.zero_points.astype(np_dtype)
    return codes.astype(np_dtype), zp, dtype


def dequantize_node(
    graph: ir.Graph, blocks: Blocks, *, name: str, axis: int
) -> tuple[list[ir.Node], ir.Value]:
    """Standard ``DequantizeLinear`` of ``blocks`` (integer zero points): the float ``W [K, N]``
    (``axis=0``) or the table ``[N, K]`` (``axis=1``)."""
    if blocks.float_zero_points:
        raise OptionError("DequantizeLinear takes integer zero points only")
    codes, zp, dtype = _dq_codes(blocks)
    scales = blocks.scales.astype(np.float32)
    if axis == 0:
        codes, scales = codes.T, scales.T
        zp = None if zp is None else zp.T
    inputs = [
        _initializer(graph, np.ascontiguousarray(codes), f"{name}.q", dtype),
        _initializer(graph, np.ascontiguousarray(scales), f"{name}.scales"),
    ]
    if zp is not None:
        inputs.append(_initializer(graph, np.ascontiguousarray(zp), f"{name}.zero_points", dtype))
    dq = ir.node(
        "DequantizeLinear",
        inputs,
        attributes={"axis": axis, "block_size": blocks.block_size},
        name=unique_name(graph, f"{name}.dq"),
    )
    return [dq], _out(dq, graph, f"{name}.dq_out")


def dq_matmul(
    graph: ir.Graph, x: ir.Value, blocks: Blocks, *, name: str
) -> tuple[list[ir.Node], ir.Value]:
    """Standard ONNX: ``MatMul(x, DequantizeLinear(codes, scales, zero points))`` (opset 21)."""
    if blocks.float_zero_points:
        return _with_offsets(graph, x, blocks, name, lambda b: dq_matmul(graph, x, b, name=name))
    nodes, w = dequantize_node(graph, blocks, name=name, axis=0)
    mm = ir.node("MatMul", [x, w], name=unique_name(graph, name))
    return [*nodes, mm], _out(mm, graph, f"{name}.out")


def _with_offsets(graph: ir.Graph, x: ir.Value, blocks: Blocks, name: str, product):
    """``x @ W`` for float zero points (module docstring): ``product`` of the blocks with integer
    zero point 0, plus ``(x @ I_blocks) @ O``."""
    k, n, bs, nb = blocks.k, blocks.n, blocks.block_size, blocks.n_blocks
    at_zero = Blocks(blocks.codes, blocks.scales, np.zeros((n, nb), np.uint8), blocks.bits, bs)
    nodes, y = product(at_zero)
    member = np.zeros((k, nb), np.float32)
    member[np.arange(k), np.arange(k) // bs] = 1.0
    offsets = -(blocks.zero_points.astype(np.float32) * blocks.scales).T  # [nb, N]
    sums = ir.node(
        "MatMul",
        [x, _initializer(graph, member, f"{name}.block_sum")],
        name=unique_name(graph, f"{name}.block_sum"),
    )
    shift = ir.node(
        "MatMul",
        [_out(sums, graph, f"{name}.block_sums"), _initializer(graph, offsets, f"{name}.offsets")],
        name=unique_name(graph, f"{name}.offset"),
    )
    add = ir.node(
        "Add",
        [y, _out(shift, graph, f"{name}.shift")],
        name=unique_name(graph, f"{name}.with_offsets"),
    )
    return [*nodes, sums, shift, add], _out(add, graph, f"{name}.out")


def gather_block_quantized(
    graph: ir.Graph, indices: ir.Value, blocks: Blocks, *, name: str, standard: bool = False
) -> tuple[list[ir.Node], ir.Value]:
    """Rows ``indices`` of the table ``blocks`` describes (``N = V`` rows of ``K = D``), in float:
    ``GatherBlockQuantized`` or, ``standard``, ``DequantizeLinear(axis=1)`` then ``Gather``."""
    if blocks.float_zero_points:
        raise OptionError("an embedding table takes integer zero points only")
    if blocks.k % blocks.block_size:
        raise OptionError(
            f"embedding width {blocks.k} is not a multiple of the block size {blocks.block_size}"
        )
    if standard:
        nodes, table = dequantize_node(graph, blocks, name=name, axis=1)
        gather = ir.node("Gather", [table, indices], name=unique_name(graph, name))
        return [*nodes, gather], _out(gather, graph, f"{name}.out")
    data = blocks.codes if blocks.bits == 8 else pack_nibbles(blocks.codes)
    inputs = [
        _initializer(graph, np.ascontiguousarray(data, np.uint8), f"{name}.data"),
        indices,
        _initializer(graph, blocks.scales.astype(np.float32), f"{name}.scales"),
    ]
    if blocks.zero_points is not None:
        zp = blocks.zero_points.astype(np.uint8)
        inputs.append(
            _initializer(graph, pack_nibbles(zp) if blocks.bits == 4 else zp, f"{name}.zero_points")
        )
    node = ir.node(
        "GatherBlockQuantized",
        inputs,
        attributes={
            "gather_axis": 0,
            "quantize_axis": 1,
            "block_size": blocks.block_size,
            "bits": blocks.bits,
        },
        domain=MS_DOMAIN,
        name=unique_name(graph, name),
    )
    return [node], _out(node, graph, f"{name}.out")
