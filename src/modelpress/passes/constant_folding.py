"""Constant folding: evaluate once, at optimization time, every node whose inputs are all constant.

The rewrite: a node whose inputs are initializers, Constant nodes or values folded before it is
removed, and each of its outputs that something still reads becomes an initializer holding the
computed value (a Constant node when it is a graph output, so the output keeps its name). Shape
arithmetic is included: after ONNX shape inference, ``Shape(x)`` (and ``Size(x)``) of a value whose
shape is static over the sliced range becomes a constant; dimensions that are dynamic stay dynamic,
as does everything computed from them.

Precondition: the node is deterministic. Never folded (``never_fold``, the size cap and the
evaluators say why, in the debug log, for a node whose inputs are all constant):
- random ops (RandomNormal, Bernoulli, ...) and Dropout (its result depends on a training flag);
- nodes with a subgraph (If/Loop/Scan) that reads values of an outer scope, and nodes in custom
  domains or with attributes referring to a function's parameters;
- DequantizeLinear: its constant int8 input is the compressed weight and runtimes fuse the
  Q/DQ pair into integer kernels, so folding it undoes the quantization;
- anything whose result would be bigger than ``max(1 MiB, the sum of its constant inputs' sizes)``.
  Folding an Expand, Tile, ConstantOfShape or Range can turn a few bytes of shape into megabytes of
  weights; users of other optimizers see models grow several-fold that way, for no speed gain (the
  runtime computes such a broadcast faster than it reads it from memory).

An ``If`` whose condition is (or became) constant is replaced by the nodes of the branch it
takes: the other branch can never run, and once its outer values are constants with static shapes
ONNX Runtime's load-time checks may reject that dead branch. Precondition (``_inline_refusal``):
the branch fits the If's outputs, and its initializers can move to the enclosing graph.

Evaluation uses ONNX Runtime (its graph optimizations disabled, so the folded value is exactly what
the unoptimized model computes at run time), all foldable nodes of a graph in one session; when ORT
cannot run that batch, each node is tried alone, with ``onnx.reference`` as the fallback for ops
or types ORT lacks. A node neither can evaluate is left as it is.

Level 1: folding changes no op of the model into another and needs no knowledge of a runtime; it
is the first thing every runtime's own optimizer does, and later passes depend on it (fusions need
constant weights, no-op elimination needs constant shapes).
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir
from onnx_ir.passes import PassResult

from modelpress.ir.graph import add_initializer, replace_value
from modelpress.ir.match import can_become_output_of
from modelpress.ir.reference import evaluate
from modelpress.ir.shapes import infer_types
from modelpress.passes.base import GraphPass
from modelpress.runtime.ort import session, session_options

log = logging.getLogger(__name__)

SIZE_CAP_BYTES = 1 << 20

_RANDOM = "random: each run draws new values"
# Op → why it is never folded, whatever its inputs.
NEVER_FOLD = {
    "RandomNormal": _RANDOM,
    "RandomUniform": _RANDOM,
    "RandomNormalLike": _RANDOM,
    "RandomUniformLike": _RANDOM,
    "Multinomial": _RANDOM,
    "Bernoulli": _RANDOM,
    "Dropout": "its result depends on a training flag",
    "DequantizeLinear": "it holds a quantized weight, which runtimes fuse into integer kernels",
}


def never_fold(node: ir.Node) -> str | None:
    """Why ``node`` is never folded whatever its inputs, or None. (Constant nodes are constants
    already: the caller skips them without a reason.)"""
    if node.domain not in ("", "ai.onnx"):
        return f"domain {node.domain!r}: no evaluator knows its ops"
    return NEVER_FOLD.get(node.op_type)


def _const_tensor(value: ir.Value) -> ir.TensorProtocol | None:
    if value.is_graph_input():  # an initializer that is also an input can be overridden
        return None
    try:
        return ir.convenience.get_const_tensor(value)
    except ValueError:  # malformed Constant node: leave it to the checker
        return None


def _static_bytes(value: ir.Value) -> int | None:
    """Bytes of ``value`` from its inferred type and shape, when both are static."""
    if value.shape is None or value.dtype is None:
        return None
    if not all(isinstance(d, int) for d in value.shape):
        return None
    try:
        return int(np.prod(list(value.shape), dtype=np.int64) * value.dtype.itemsize)
    except (TypeError, ValueError):
        return None


def _shape_dims(node: ir.Node, partial: dict[ir.Value, list]) -> list | None:
    """Shape arithmetic on dimensions: what Shape/Size, and Gather/Slice of a shape, return.

    The result lists each element as an int when static and None when dynamic; None overall when
    nothing is known. ``partial`` holds the known lists of earlier shape values.
    """
    x = node.inputs[0] if node.inputs else None
    if x is None:
        return None
    if node.op_type in ("Shape", "Size"):
        if x.shape is None:
            return None
        dims = [d if isinstance(d, int) else None for d in x.shape]
        if node.op_type == "Size":
            return [int(np.prod(dims))] if None not in dims else [None]
        rank = len(dims)
        start = node.attributes.get_int("start", 0)
        end = node.attributes.get_int("end", rank)
        return dims[slice(*(min(max(i + rank if i < 0 else i, 0), rank) for i in (start, end)))]
    dims = partial.get(x)
    if dims is None:
        return None
    if node.op_type == "Gather" and node.attributes.get_int("axis", 0) == 0:
        index = _const_tensor(node.inputs[1]) if len(node.inputs) > 1 else None
        if index is None or index.shape.rank() > 1:
            return None
        picked = index.numpy().reshape(-1).tolist()
        if not all(-len(dims) <= i < len(dims) for i in picked):
            return None
        return [dims[i] for i in picked]
    if node.op_type == "Slice" and node.attributes.get("starts") is None:
        args = [_const_tensor(v) if v is not None else None for v in node.inputs[1:5]]
        if any(a is None for a in args[:2]) or any(
            a is None and v is not None for a, v in zip(args[2:], node.inputs[3:5], strict=False)
        ):
            return None
        start, end, *rest = (
            int(a.numpy().reshape(-1)[0]) if a is not None and a.size == 1 else a for a in args
        )
        axis, step = (rest + [None, None])[:2]
        if not isinstance(start, int) or not isinstance(end, int) or axis not in (None, 0, -1):
            return None
        step = 1 if step is None else step
        if not isinstance(step, int) or step <= 0:
            return None
        # For positive steps ONNX clamps start and end exactly as Python slicing does.
        return dims[start:end:step]
    return None


def _copy_attributes(node: ir.Node) -> list[ir.Attr] | None:
    """Attributes for a copy of ``node``; None when one refers to something outside the node."""
    attrs = []
    for name, attr in node.attributes.items():
        if attr.is_ref():
            return None
        if attr.type == ir.AttributeType.GRAPH:
            try:  # clone() refuses a subgraph that reads outer-scope values
                value = attr.as_graph().clone()
            except Exception:  # noqa: BLE001 - the cloner wraps its error in RuntimeError
                return None
        elif attr.type == ir.AttributeType.GRAPHS:
            try:
                value = [g.clone() for g in attr.as_graphs()]
            except Exception:  # noqa: BLE001
                return None
        else:
            value = attr.value
        attrs.append(ir.Attr(name, attr.type, value))
    return attrs


class _Evaluator:
    """Runs standalone copies of nodes on constant inputs (ORT first, onnx.reference second)."""

    def __init__(self, model: ir.Model):
        self.opsets = dict(model.opset_imports)
        self.ir_version = model.ir_version

    def run(
        self, nodes: list[ir.Node], consts: dict[ir.Value, ir.TensorProtocol]
    ) -> dict[ir.Value, object] | None:
        """Outputs of ``nodes`` (by original Value) computed from ``consts``; None on failure."""
        mapping: dict[ir.Value, ir.Value] = {}
        initializers = []
        copies = []
        outputs: list[tuple[ir.Value, ir.Value]] = []
        taken: set[str] = set()
        for node in nodes:
            inputs = []
            for v in node.inputs:
                if v is None:
                    inputs.append(None)
                    continue
                if v not in mapping:
                    if v not in consts:
                        return None
                    tensor = consts[v]
                    # Keep the value's own name: naming a Value renames its tensor, which may be
                    # the model's own initializer.
                    name = v.name if v.name and v.name not in taken else f"__fold_c{len(mapping)}"
                    taken.add(name)
                    init = ir.Value(name=name, const_value=tensor)
                    init.shape = ir.Shape(tensor.shape)
                    init.dtype = tensor.dtype
                    initializers.append(init)
                    mapping[v] = init
                inputs.append(mapping[v])
            attrs = _copy_attributes(node)
            if attrs is None:
                return None
            copy = ir.Node(
                node.domain,
                node.op_type,
                inputs,
                attrs,
                num_outputs=len(node.outputs),
                version=node.version,
            )
            for i, (orig, new) in enumerate(zip(node.outputs, copy.outputs, strict=True)):
                new.name = f"__fold_o{len(outputs)}_{i}"
                mapping[orig] = new
                outputs.append((orig, new))
            copies.append(copy)
        graph = ir.Graph(
            [],
            [new for _, new in outputs],
            nodes=copies,
            initializers=initializers,
            opset_imports=self.opsets,
        )
        model = ir.Model(graph, ir_version=self.ir_version)
        values = self._ort(model) or self._reference(model)
        if values is None:
            return None
        return {orig: val for (orig, _), val in zip(outputs, values, strict=True)}

    @staticmethod
    def _ort(model: ir.Model) -> list | None:
        options = session_options(optimize="disabled")
        options.log_severity_level = 4  # a node that fails here is retried or left alone: no noise
        try:
            return session(model, options=options).run(None, {})
        except Exception as exc:  # noqa: BLE001 - ORT lacks some ops/types; try the reference
            log.debug("ORT cannot fold: %s", exc)
            return None

    @staticmethod
    def _reference(model: ir.Model) -> list | None:
        try:
            return evaluate(model)
        except Exception as exc:  # noqa: BLE001 - an op neither evaluator has: do not fold
            log.debug("onnx.reference cannot fold: %s", exc)
            return None


def _usable(array: object, value: ir.Value) -> bool:
    """Whether an evaluated result can stand in for ``value`` as a constant tensor."""
    if not isinstance(array, np.ndarray) or array.dtype == object:
        return False
    try:
        dtype = ir.DataType.from_numpy(array.dtype)
    except (TypeError, ValueError):
        return False
    return value.dtype is None or value.dtype == dtype


def _taken_branch(node: ir.Node) -> ir.Graph | None:
    """The branch an If with a constant condition takes, or None."""
    cond = _const_tensor(node.inputs[0]) if node.inputs and node.inputs[0] is not None else None
    if cond is None or cond.size != 1:
        return None
    attr = node.attributes.get(
        "then_branch" if bool(cond.numpy().reshape(-1)[0]) else "else_branch"
    )
    if attr is None or attr.is_ref() or attr.type != ir.AttributeType.GRAPH:
        return None
    return attr.as_graph()


def _inline_refusal(graph: ir.Graph | ir.Function, node: ir.Node, branch: ir.Graph) -> str | None:
    """Why the If ``node`` cannot be replaced by the nodes of ``branch``, or None."""
    if len(branch.outputs) != len(node.outputs) or branch.inputs:
        return "the branch's inputs or outputs do not fit the If"
    if branch.initializers and (
        isinstance(graph, ir.Function)
        or any(name in graph.initializers for name in branch.initializers)
    ):
        return "the branch's initializers have nowhere to go (a function) or their names are taken"
    return None


def _inline(graph: ir.Graph | ir.Function, node: ir.Node, branch: ir.Graph) -> None:
    """Replace the If ``node`` by the nodes of ``branch``, the one it takes."""
    for value in list(branch.initializers.values()):
        branch.initializers.pop(value.name)
        graph.register_initializer(value)
    results = list(branch.outputs)
    branch.outputs.clear()
    nodes = list(branch)
    branch.remove(nodes)
    graph.insert_before(node, nodes)
    for out, result in zip(node.outputs, results, strict=True):
        # A branch may return an outer value or an initializer, which cannot take a graph
        # output's name: an Identity carries it then (the identity pass removes what it can).
        if not (
            (not out.is_graph_output() or can_become_output_of(result, graph))
            and replace_value(out, result)
        ):
            identity = ir.node("Identity", [result])
            graph.insert_before(node, identity)
            identity.outputs[0].type, identity.outputs[0].shape = out.type, out.shape
            replace_value(out, identity.outputs[0])
    graph.remove(node, safe=True)


class FoldConstants(GraphPass):
    """Replace every node computable from constants by its result (rules in the module doc)."""

    name = "constant-folding"
    level = 1

    def call(self, model: ir.Model) -> PassResult:
        # Static shapes make Shape() foldable; inference is best-effort (the pass leaves the model
        # unchanged when it fails) and keeps symbolic dimensions symbolic.
        infer_types(model)
        self._evaluator = _Evaluator(model)
        return super().call(model)

    def rewrite_graph(self, graph: ir.Graph | ir.Function) -> int:
        consts: dict[ir.Value, ir.TensorProtocol] = {}
        folded: dict[ir.Value, np.ndarray] = {}  # results computed here, not yet materialized
        candidates: list[ir.Node] = []

        def constant(v: ir.Value) -> bool:
            if v in consts or v in folded:
                return True
            tensor = _const_tensor(v)
            if tensor is not None:
                consts[v] = tensor
            return tensor is not None

        def nbytes(v: ir.Value) -> int | None:
            if v in folded:
                return folded[v].nbytes
            if v in consts:
                return consts[v].nbytes
            return _static_bytes(v)

        # One sweep in topological order: Shape/Size of static shapes are known at once; other
        # nodes whose inputs are all constant become candidates, unless their inferred output
        # size already breaks the cap.
        pending: set[ir.Value] = set()
        partial: dict[ir.Value, list] = {}  # shape values with some dimensions known
        known_early: set[ir.Node] = set()
        for node in graph:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                continue
            reason = never_fold(node)
            if reason is not None:
                # Worth a word only when it was foldable otherwise (every input constant).
                if log.isEnabledFor(logging.DEBUG) and all(
                    v in consts or v in folded or _const_tensor(v) is not None
                    for v in node.inputs
                    if v is not None
                ):
                    self.refuse(node, reason)
                continue
            if node.op_type in ("Shape", "Size", "Gather", "Slice"):
                dims = _shape_dims(node, partial)
                if dims is not None and None not in dims:
                    shape: tuple[int, ...] = (len(dims),)
                    if node.op_type == "Size":
                        shape = ()
                    elif node.op_type == "Gather":  # the result has the indices' shape
                        shape = tuple(_const_tensor(node.inputs[1]).shape.numpy())
                    folded[node.outputs[0]] = np.array(dims, dtype=np.int64).reshape(shape)
                    candidates.append(node)
                    known_early.add(node)
                    continue
                if dims is not None:
                    partial[node.outputs[0]] = dims
            ins = [v for v in node.inputs if v is not None]
            if not all(constant(v) or v in pending for v in ins):
                continue
            sizes = [nbytes(v) for v in ins]
            cap = max(SIZE_CAP_BYTES, sum(s for s in sizes if s is not None))
            if any((b := _static_bytes(o)) is not None and b > cap for o in node.outputs):
                self.refuse(node, f"its result would be over the cap of {cap} bytes")
                continue
            candidates.append(node)
            pending.update(node.outputs)

        to_run = [n for n in candidates if n not in known_early]
        results = self._evaluate(to_run, consts, folded)

        # Decide in order: a node folds when every input is constant and each result fits the cap.
        done: list[ir.Node] = []
        for node in candidates:
            if node in known_early:
                done.append(node)
                continue
            ins = [v for v in node.inputs if v is not None]
            if not all(v in consts or v in folded for v in ins):
                self.refuse(node, "an input it reads could not be folded")
                continue
            cap = max(SIZE_CAP_BYTES, sum(nbytes(v) or 0 for v in ins))
            outs = [results.get(o) for o in node.outputs]
            if not all(_usable(a, o) for a, o in zip(outs, node.outputs, strict=True)):
                self.refuse(
                    node, "neither ONNX Runtime nor onnx.reference computed a usable result"
                )
                continue
            if any(a.nbytes > cap for a in outs):
                self.refuse(node, f"its result is over the cap of {cap} bytes")
                continue
            folded.update(zip(node.outputs, outs, strict=True))
            done.append(node)

        count = self._materialize(graph, done, folded)
        for node in list(graph):
            if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
                continue
            branch = _taken_branch(node)
            if branch is None:
                continue
            reason = _inline_refusal(graph, node, branch)
            if reason is not None:
                self.refuse(node, reason)
                continue
            _inline(graph, node, branch)
            count += 1
        return count

    def _evaluate(
        self,
        nodes: list[ir.Node],
        consts: dict[ir.Value, ir.TensorProtocol],
        folded: dict[ir.Value, np.ndarray],
    ) -> dict[ir.Value, object]:
        if not nodes:
            return {}
        known: dict[ir.Value, ir.TensorProtocol] = dict(consts)
        known.update({v: ir.tensor(a) for v, a in folded.items()})
        results = self._evaluator.run(nodes, known)
        if results is not None:
            return results
        # The batch failed (one op ORT lacks is enough): evaluate node by node instead.
        results = {}
        for node in nodes:
            out = self._evaluator.run([node], known)
            if out is None:
                continue
            results.update(out)
            for v, a in out.items():
                if _usable(a, v):
                    known[v] = ir.tensor(a)
        return results

    @staticmethod
    def _materialize(graph, done: list[ir.Node], folded: dict[ir.Value, np.ndarray]) -> int:
        done_set = set(done)
        for node in done:
            for out in node.outputs:
                readers = [user for user, _ in out.uses() if user not in done_set]
                if not readers and not out.is_graph_output():
                    continue
                array = folded[out]
                if out.is_graph_output():
                    # An output cannot be renamed onto an initializer; a Constant node can take it.
                    const = ir.node("Constant", [], attributes={"value": ir.tensor(array)})
                    graph.insert_before(node, const)
                    new = const.outputs[0]
                    new.dtype = ir.DataType.from_numpy(array.dtype)
                    new.shape = ir.Shape(array.shape)
                else:
                    new = add_initializer(graph, array, out.name or "folded")
                replace_value(out, new)
        count = 0
        for node in reversed(done):
            if all(not o.uses() and not o.is_graph_output() for o in node.outputs):
                graph.remove(node, safe=True)
                count += 1
        return count
