"""An ONNX graph as a trainable ``torch.nn.Module``.

``to_torch(model)`` compiles the graph once into a list of steps (one kernel call per node, in the
graph's topological order) and registers every initializer on the module:

* a floating-point initializer with more than one element becomes an ``nn.Parameter`` (weights and
  biases of Conv, Gemm, MatMul, the norms, recurrent cells, ...), unless every use of it is a slot
  that holds statistics or settings rather than weights (BatchNormalization's running mean and
  variance, Resize scales, Clip bounds, quantization scales and zero points);
* everything else (integer tensors: shapes, indices; scalars; the values of Constant nodes) becomes
  a buffer, so that ``.to(device)`` moves it and ``state_dict()`` holds it.

Attribute names on the module are the ONNX names with characters other than ``[A-Za-z0-9_]``
replaced (``onnx_names`` maps one to the other). ``forward(*inputs, **named)`` takes tensors in the
order of the graph inputs (or by name) and returns one tensor when the graph has one output, else a
tuple in the order of ``output_names``. Subgraphs (If, Loop, Scan) are compiled the same way and run
recursively with the enclosing values in scope.

Nodes whose inputs are all build-time constants (buffers, Constant nodes) and whose result is small
are evaluated once at build time and stored as buffers (shape arithmetic, mostly); so a buffer
changed after building does not reach those folded results: build the module again.

Training semantics are ONNX's inference semantics: BatchNormalization uses its running statistics
and Dropout is the identity even under ``module.train()`` (fine-tuning with frozen statistics), so a
trained module exports back to the same graph (``export.to_onnx``).

``torch.compile``: with ``compile=True`` the module's ``forward`` is compiled by TorchDynamo, which
unrolls the graph walk. Shape arguments that are constants (initializers, Constant nodes, folded
nodes) are Python values at build time, and the ``Shape -> Gather -> Concat -> Reshape`` chains of
exported graphs are evaluated on Python ints at run time (``shapes.py``), so static-shape CNNs and
transformers trace as one graph. What still breaks the trace into several graphs (correct, only
slower): integer values computed from tensor *data* and then used as shapes or counts (read back
with ``.tolist()``), the condition of ``If`` and the trip count/condition of ``Loop`` (``.item()``),
and data-dependent output shapes (NonZero, Compress, TopK with a computed K).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir
import torch
from torch import nn

from modelpress.runtime.torch_backend import ops as _ops  # noqa: F401  (registers the kernels)
from modelpress.runtime.torch_backend.errors import NodeRunError, UnsupportedOpError
from modelpress.runtime.torch_backend.registry import (
    MIN_OPSET,
    OPS,
    SCOPED,
    NodeContext,
    from_numpy,
    to_numpy,
)
from modelpress.runtime.torch_backend.shapes import SHAPE_FNS, Small, const_small, evaluate

# Input slots that hold statistics or settings, not weights: (op_type, input index).
_NOT_TRAINABLE = {
    ("BatchNormalization", 3),
    ("BatchNormalization", 4),
    ("Resize", 1),
    ("Resize", 2),
    ("Upsample", 1),
    ("Clip", 1),
    ("Clip", 2),
    ("Pad", 2),
    ("QuantizeLinear", 1),
    ("QuantizeLinear", 2),
    ("DequantizeLinear", 1),
    ("DequantizeLinear", 2),
    ("ConstantOfShape", 0),
    ("Range", 0),
    ("Range", 1),
    ("Range", 2),
}
_FLOAT_TYPES = {ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16}


def _is_trainable(value: ir.Value, array: np.ndarray) -> bool:
    if value.dtype not in _FLOAT_TYPES or array.size <= 1:
        return False
    uses = list(value.uses())
    if value.is_graph_input() and not uses:
        return False
    return not uses or any((u.node.op_type, u.idx) not in _NOT_TRAINABLE for u in uses)


def _to_tensor(array: np.ndarray, value_name: str) -> torch.Tensor:
    try:
        return from_numpy(array).clone()  # a copy: training must not write into the ONNX model
    except TypeError:
        raise UnsupportedOpError(
            f"initializer {value_name!r}: element type {array.dtype} is not supported by the PyTorch backend"
        ) from None


@dataclass
class _Step:
    fn: Any
    ctx: NodeContext
    inputs: list[str]
    outputs: list[str]
    scoped: bool
    # shape arithmetic evaluated in Python (shapes.py), with the constant inputs as Small values
    shape_fn: Any = None
    const_smalls: list = None


class _Program:
    """One compiled graph: its steps, the initializers it reads and its input/output names."""

    def __init__(
        self,
        graph: ir.Graph,
        module: OnnxModule,
        opsets: dict[str, int],
        graph_index: int,
        outer_consts: dict[str, np.ndarray] | None = None,
    ):
        self.inputs = [v.name for v in graph.inputs]
        self.outputs = [v.name for v in graph.outputs]
        self.tensors: list[tuple[str, str]] = []  # (onnx name, module attribute)
        # Values known at build time (buffers, Constant nodes, folded nodes); graph inputs shadow
        # outer names, and an initializer that is also a graph input can be overridden by a feed.
        consts = {k: v for k, v in (outer_consts or {}).items() if k not in self.inputs}
        for name, value in graph.initializers.items():
            array = value.const_value.numpy()
            attr = module._register(graph_index, name, array, trainable=_is_trainable(value, array))
            self.tensors.append((name, attr))
            if attr in module._buffers and not value.is_graph_input():
                consts[name] = array
        self.steps: list[_Step] = []
        for index, node in enumerate(graph):
            domain = "" if node.domain == "ai.onnx" else node.domain
            key = (domain, node.op_type)
            label = node.name or f"#{index}"
            if node.op_type == "Constant" and domain == "":
                name = node.outputs[0].name
                array = _constant_value(node, label)
                attr = module._register(graph_index, name, array, trainable=False, constant=True)
                self.tensors.append((name, attr))
                consts[name] = array
                continue
            if key not in OPS:
                where = f" in domain {domain!r}" if domain else ""
                raise UnsupportedOpError(
                    f"node {label!r}: op {node.op_type}{where} is not supported by the PyTorch backend "
                    "(`modelpress ops --backend torch` lists the supported ops)"
                )
            opset = opsets.get(domain, opsets.get("", 1))
            if opset < MIN_OPSET.get(key, 1):
                raise UnsupportedOpError(
                    f"node {label!r}: {node.op_type} of opset {opset} is not supported by the PyTorch "
                    f"backend (needs opset {MIN_OPSET[key]} or newer)"
                )
            subgraphs = {}
            for attr_name, attr in node.attributes.items():
                if attr.type == ir.AttributeType.GRAPH:
                    module._graph_count += 1
                    subgraphs[attr_name] = _Program(
                        attr.value, module, opsets, module._graph_count, consts
                    )
            in_names = [v.name if v is not None else "" for v in node.inputs]
            ctx = NodeContext(
                node,
                index=index,
                opset=opset,
                consts=[consts.get(n) if n else None for n in in_names],
                subgraphs=subgraphs,
            )
            out_names = [v.name if v is not None else "" for v in node.outputs]
            step = _Step(OPS[key], ctx, in_names, out_names, key in SCOPED)
            if domain == "" and node.op_type in SHAPE_FNS:
                step.shape_fn = SHAPE_FNS[node.op_type]
                step.const_smalls = [
                    const_small(c, shp, from_numpy(np.asarray(consts[n]).reshape(-1)[:0]).dtype)
                    if c is not None
                    else None
                    for c, shp, n in zip(ctx.consts, ctx.const_shapes, in_names, strict=True)
                ]
            folded = None if step.scoped or key in _NOT_FOLDED else _fold(step, consts)
            if folded is None:
                self.steps.append(step)
                continue
            for name, array in folded.items():
                attr = module._register(graph_index, name, array, trainable=False, constant=True)
                self.tensors.append((name, attr))
                consts[name] = array

    def run(
        self, module: OnnxModule, feeds: dict[str, torch.Tensor], outer: dict | None = None
    ) -> list[torch.Tensor]:
        env: dict[str, Any] = dict(outer) if outer else {}
        for name, attr in self.tensors:
            env[name] = getattr(module, attr)
        env.update(feeds)
        device = next((t.device for t in feeds.values()), None) or next(
            (t.device for t in env.values() if isinstance(t, torch.Tensor)), torch.device("cpu")
        )
        mirror: dict[str, Small] = {}  # values computed in Python (shapes.py), not yet tensors
        step = None
        try:
            for step in self.steps:
                if step.shape_fn is not None:
                    small = self._shape_eval(step, env, mirror)
                    if small is not None:
                        mirror[step.outputs[0]] = small
                        continue
                ctx = step.ctx
                if mirror:
                    if step.scoped:  # a subgraph may read any outer value
                        for n, v in mirror.items():
                            env.setdefault(n, v.tensor(device))
                    known = [mirror[n].values if n in mirror else None for n in step.inputs]
                    if any(k is not None for k in known):
                        ctx = ctx.with_known(known)
                        for n in step.inputs:
                            if n and n not in env and n in mirror:
                                env[n] = mirror[n].tensor(device)
                args = [env[n] if n else None for n in step.inputs]
                if step.scoped:
                    result = step.fn(ctx, env, module, *args)
                else:
                    result = step.fn(ctx, *args)
                if isinstance(result, (tuple, list)):
                    for n, r in zip(step.outputs, result, strict=False):
                        if n:
                            env[n] = r
                else:
                    env[step.outputs[0]] = result
        except (RuntimeError, ValueError, IndexError, TypeError) as exc:
            if step is None:
                raise
            msg = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            raise NodeRunError(
                f"node {step.ctx.name!r} ({step.ctx.op_type}) failed: {msg}"
            ) from exc
        return [env[n] if n in env else mirror[n].tensor(device) for n in self.outputs]

    @staticmethod
    def _shape_eval(step: _Step, env: dict, mirror: dict) -> Small | None:
        args = []
        for i, n in enumerate(step.inputs):
            if not n:
                args.append(None)
            elif n in mirror:
                args.append(mirror[n])
            elif step.const_smalls[i] is not None:
                args.append(step.const_smalls[i])
            elif i == 0 and step.ctx.op_type == "Shape" and n in env:
                args.append(env[n])  # only its shape is read
            else:
                return None
        return evaluate(step.shape_fn, step.ctx, args)


# Nodes never folded: random ones, and ones whose result may be large even from small inputs.
_NOT_FOLDED = {
    ("", "Dropout"),
    ("", "ConstantOfShape"),
    ("", "Expand"),
    ("", "Tile"),
    ("", "Range"),
}
_FOLD_LIMIT = 4096


def _fold(step: _Step, consts: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """The outputs of a node whose inputs are all build-time constants, or None.

    Folding the shape arithmetic of exported graphs (Shape of a constant, Gather, Concat, ...) once
    at build time saves a kernel call per node per run and gives the kernels Python values. Only
    small results are folded, so no large tensor is stored twice.
    """
    names = [n for n in step.inputs if n]
    if not names or any(n not in consts for n in names):
        return None
    if sum(consts[n].size for n in names) > _FOLD_LIMIT:
        return None
    args = [from_numpy(np.asarray(consts[n]).copy()) if n else None for n in step.inputs]
    try:
        result = step.fn(step.ctx, *args)
    except Exception:  # leave it to run time, where a failure names the node
        return None
    results = result if isinstance(result, (tuple, list)) else (result,)
    if any(not isinstance(r, torch.Tensor) or r.numel() > _FOLD_LIMIT for r in results):
        return None
    return {n: to_numpy(r) for n, r in zip(step.outputs, results, strict=False) if n}


def _constant_value(node: ir.Node, label: str) -> np.ndarray:
    for key, attr in node.attributes.items():
        v = attr.value
        if key == "value":
            return v.numpy()
        if key == "value_float":
            return np.array(v, dtype=np.float32)
        if key == "value_floats":
            return np.array(list(v), dtype=np.float32)
        if key == "value_int":
            return np.array(v, dtype=np.int64)
        if key == "value_ints":
            return np.array(list(v), dtype=np.int64)
    raise UnsupportedOpError(
        f"node {label!r}: a Constant of this kind (sparse or string) is not supported by the PyTorch backend"
    )


class OnnxModule(nn.Module):
    """An ONNX model as a ``torch.nn.Module``; build it with ``to_torch``."""

    def __init__(self, model: ir.Model):
        super().__init__()
        self.model = model
        self.onnx_names: dict[str, str] = {}
        # (graph index, ONNX initializer name) -> attribute, for every graph and subgraph.
        self.tensor_attrs: dict[tuple[int, str], str] = {}
        self._graph_count = 0
        opsets = {("" if k == "ai.onnx" else k): v for k, v in model.opset_imports.items()}
        if model.functions:
            name = next(iter(model.functions.values())).name
            raise UnsupportedOpError(
                f"model-local function {name!r}: inline the model's functions before building a PyTorch module"
            )
        self.program = _Program(model.graph, self, opsets, 0)
        initialized = {n for n, _ in self.program.tensors}
        self.input_names = [n for n in self.program.inputs if n not in initialized]
        self.optional_input_names = [n for n in self.program.inputs if n in initialized]
        self.output_names = list(self.program.outputs)

    def _register(
        self,
        graph_index: int,
        name: str,
        array: np.ndarray,
        *,
        trainable: bool,
        constant: bool = False,
    ) -> str:
        base = re.sub(r"\W", "_", name) or "t"
        if base[0].isdigit():
            base = "t_" + base
        attr, k = base, 1
        while hasattr(self, attr) or attr in self._parameters or attr in self._buffers:
            attr, k = f"{base}_{k}", k + 1
        tensor = _to_tensor(array, name)
        if trainable:
            self.register_parameter(attr, nn.Parameter(tensor))
        else:
            self.register_buffer(attr, tensor)
        if not constant:
            self.tensor_attrs[(graph_index, name)] = attr
            if graph_index == 0:
                self.onnx_names[name] = attr
        return attr

    def forward(self, *inputs: torch.Tensor, **named: torch.Tensor):
        if len(inputs) > len(self.input_names):
            raise NodeRunError(f"the model takes {len(self.input_names)} inputs, got {len(inputs)}")
        feeds = dict(zip(self.input_names, inputs, strict=False))
        feeds.update(named)
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise NodeRunError(
                f"missing input {missing[0]!r}; the model's inputs: {', '.join(self.input_names)}"
            )
        outputs = self.program.run(self, feeds)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def to_torch(
    model: ir.Model, *, compile: bool = False, device: str | torch.device | None = None
) -> OnnxModule:
    """Build an ``OnnxModule`` for ``model`` (optionally moved to ``device`` and compiled).

    Raises ``UnsupportedOpError`` naming the first node whose op the backend does not implement.
    """
    module = OnnxModule(model).eval()
    if device is not None:
        module = module.to(device)
    if compile:
        module.compile(dynamic=False)
    return module
