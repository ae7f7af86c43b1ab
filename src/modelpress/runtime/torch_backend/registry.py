"""The operator registry of the PyTorch backend and the per-node context its kernels receive.

A kernel is ``fn(ctx, *inputs) -> tensor | tuple[tensor, ...]``, registered with ``@op("Conv")``
under ``(domain, op_type)``; a missing optional input arrives as ``None``. Scoped kernels (If, Loop,
Scan) also receive the enclosing environment, since their subgraphs read outer values by name.
The context carries the node's attributes, the opset of its domain, the values of inputs that are
constants (so that shape arguments become Python ints without reading a tensor back, which keeps
``torch.compile`` from breaking the graph there) and the compiled subgraphs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir
import torch

from modelpress.runtime.torch_backend.errors import UnsupportedOpError

Kernel = Callable[..., Any]
# constant inputs up to this many elements are kept as Python values for the kernels
_MAX_CONST = 4096

OPS: dict[tuple[str, str], Kernel] = {}
SCOPED: set[tuple[str, str]] = set()
# The lowest opset version a kernel implements; older versions of the op differ in meaning.
MIN_OPSET: dict[tuple[str, str], int] = {}


def op(*op_types: str, domain: str = "", scoped: bool = False, since: int = 1):
    """Register the decorated kernel for each of ``op_types`` in ``domain``."""

    def register(fn: Kernel) -> Kernel:
        for name in op_types:
            key = (domain, name)
            assert key not in OPS, f"kernel for {key} registered twice"
            OPS[key] = fn
            if scoped:
                SCOPED.add(key)
            if since > 1:
                MIN_OPSET[key] = since
        return fn

    return register


TORCH_DTYPES: dict[ir.DataType, torch.dtype] = {
    ir.DataType.FLOAT: torch.float32,
    ir.DataType.DOUBLE: torch.float64,
    ir.DataType.FLOAT16: torch.float16,
    ir.DataType.BFLOAT16: torch.bfloat16,
    ir.DataType.INT8: torch.int8,
    ir.DataType.INT16: torch.int16,
    ir.DataType.INT32: torch.int32,
    ir.DataType.INT64: torch.int64,
    ir.DataType.UINT8: torch.uint8,
    ir.DataType.UINT16: torch.uint16,
    ir.DataType.UINT32: torch.uint32,
    ir.DataType.UINT64: torch.uint64,
    ir.DataType.BOOL: torch.bool,
    ir.DataType.COMPLEX64: torch.complex64,
    ir.DataType.COMPLEX128: torch.complex128,
    ir.DataType.FLOAT8E4M3FN: torch.float8_e4m3fn,
    ir.DataType.FLOAT8E5M2: torch.float8_e5m2,
    ir.DataType.FLOAT8E4M3FNUZ: torch.float8_e4m3fnuz,
    ir.DataType.FLOAT8E5M2FNUZ: torch.float8_e5m2fnuz,
}


def attr_value(attr: ir.Attr) -> Any:
    """A node attribute as a plain Python value (tensors as numpy arrays, graphs as ``ir.Graph``)."""
    value = attr.value
    if attr.type == ir.AttributeType.TENSOR:
        return from_numpy(value.numpy()).clone()
    if attr.type in (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS):
        return list(value)
    return value


class NodeContext:
    """What a kernel knows about its node besides the input tensors."""

    def __init__(
        self,
        node: ir.Node,
        *,
        index: int,
        opset: int,
        consts: list[np.ndarray | None],
        subgraphs: dict[str, Any],
    ):
        self.op_type = node.op_type
        self.domain = node.domain
        self.name = node.name or f"#{index}"
        self.opset = opset
        self.attrs = {
            k: attr_value(a) for k, a in node.attributes.items() if a.type != ir.AttributeType.GRAPH
        }
        # the values of small tensor attributes as Python numbers (ConstantOfShape's value)
        self.attr_values = {
            k: tuple(v.reshape(-1).tolist())
            for k, v in self.attrs.items()
            if isinstance(v, torch.Tensor) and v.numel() <= _MAX_CONST
        }
        # Python values, not arrays: TorchDynamo would trace numpy arrays as tensors.
        small = [c is not None and np.asarray(c).size <= _MAX_CONST for c in consts]
        self.consts = [
            tuple(np.asarray(c).reshape(-1).tolist()) if ok else None
            for c, ok in zip(consts, small, strict=True)
        ]
        self.const_shapes = [
            tuple(np.asarray(c).shape) if ok else None for c, ok in zip(consts, small, strict=True)
        ]
        # The inputs' values when the program computed them in Python (shapes.py); only set on
        # the per-run copies ``with_known`` makes, never on the shared context.
        self.known: list[tuple | None] | None = None
        self.subgraphs = subgraphs
        self.num_outputs = len(node.outputs)
        self.outputs_used = [bool(v is not None and v.name) for v in node.outputs]

    def with_known(self, known: list[tuple | None]) -> NodeContext:
        """A copy that sees these Python input values: one run's, so that runs can overlap."""
        bound = copy.copy(self)
        bound.known = known
        return bound

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def _python_value(self, i: int) -> tuple | None:
        if self.known is not None and i < len(self.known) and self.known[i] is not None:
            return self.known[i]
        return self.consts[i] if i < len(self.consts) else None

    def ints(self, i: int, t: torch.Tensor | None) -> list[int] | None:
        """Input ``i`` as a list of ints: from Python when known, else read from the tensor."""
        return self._numbers(i, t, int)

    def floats(self, i: int, t: torch.Tensor | None) -> list[float] | None:
        """Input ``i`` as a list of floats (from Python when known)."""
        return self._numbers(i, t, float)

    def _numbers(self, i: int, t: torch.Tensor | None, kind: type) -> list | None:
        if t is None:
            return None
        value = self._python_value(i)
        return [kind(v) for v in (t.reshape(-1).tolist() if value is None else value)]

    def scalar(self, i: int, t: torch.Tensor | None) -> float | int | bool | None:
        """Input ``i`` (a one-element tensor) as a Python number."""
        if t is None:
            return None
        value = self._python_value(i)
        if value is not None:
            return value[0]
        return t.reshape(-1)[0].item()

    def unsupported(self, what: str) -> UnsupportedOpError:
        return UnsupportedOpError(
            f"node {self.name!r} ({self.op_type}): {what} is not supported by the PyTorch backend"
        )


def torch_dtype(onnx_type: int, ctx: NodeContext | None = None) -> torch.dtype:
    """The torch dtype of an ONNX element type (``TensorProto.DataType`` number)."""
    dt = ir.DataType(onnx_type)
    if dt not in TORCH_DTYPES:
        if ctx is not None:
            raise ctx.unsupported(f"element type {dt.name}")
        raise UnsupportedOpError(f"element type {dt.name} is not supported by the PyTorch backend")
    return TORCH_DTYPES[dt]


def axis_of(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


# numpy cannot hold bfloat16 or float8; ONNX tooling uses ml_dtypes for them, torch has its own.
_BITS_VIEW = {
    "bfloat16": (np.uint16, torch.bfloat16),
    "float8_e4m3fn": (np.uint8, torch.float8_e4m3fn),
    "float8_e5m2": (np.uint8, torch.float8_e5m2),
    "float8_e4m3fnuz": (np.uint8, torch.float8_e4m3fnuz),
    "float8_e5m2fnuz": (np.uint8, torch.float8_e5m2fnuz),
}


_NIBBLES = {"int4": np.int8, "uint4": np.uint8}


def from_numpy(array: np.ndarray) -> torch.Tensor:
    """A torch tensor (sharing memory where it can) for a numpy array, incl. ml_dtypes arrays."""
    array = np.asarray(array)
    if not array.flags.c_contiguous or not array.flags.writeable:
        array = array.copy(order="C")  # np.ascontiguousarray would turn a 0-d array into 1-d
    view = _BITS_VIEW.get(array.dtype.name)
    if view is not None:
        return torch.from_numpy(array.view(view[0])).view(view[1])
    if array.dtype.name in _NIBBLES:  # 4-bit integers (ml_dtypes): one a byte, values as they are
        return torch.from_numpy(array.astype(_NIBBLES[array.dtype.name]))
    if array.dtype == object or array.dtype.kind in "SUV":
        raise TypeError(f"arrays of dtype {array.dtype} have no torch equivalent")
    return torch.from_numpy(array)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """The inverse of ``from_numpy`` (bfloat16/float8 come back as ml_dtypes arrays)."""
    tensor = tensor.detach().cpu()
    for name, (bits, dtype) in _BITS_VIEW.items():
        if tensor.dtype == dtype:
            import ml_dtypes

            return (
                tensor.view(torch.uint16 if bits is np.uint16 else torch.uint8)
                .numpy()
                .view(getattr(ml_dtypes, name))
            )
    return tensor.numpy()
