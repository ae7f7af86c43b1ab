"""Exact rewrites done before static quantization, each with its inverse for what stays float.

A ``Reversible`` rewrite turns ops without a fast int8 kernel into ops that have one, computing
the same values, and says which new node came from which node of the float model; after planning,
``inverse`` puts back the float form of those the plan left in float (there the original op is the
faster float kernel):

- ``PoolsAsConvs``: average pools become depthwise Convs with equal weights ``1/k``, exact on the
  int8 grid, so they run in the 8-bit chain;
- ``AffinesAsConvs``: a per-channel affine the optimizer could not fold (a BatchNorm after a
  Concat) becomes depthwise 1x1 Convs, one per Concat input.

``name_nodes`` gives every node a unique name first (plans and reports refer to nodes by name).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.compress.quantize.layers import (
    WEIGHT_INPUT,
    constant,
    is_channel_constant,
    is_float,
)
from modelpress.compress.quantize.ops import is_activation, relu_after, through
from modelpress.compress.quantize.selection import select_layers
from modelpress.ir.graph import (
    bulk_names,
    copy_model,
    replace_value,
    reserve,
    swap_node,
    unique_name,
)
from modelpress.ir.match import const_array


def name_nodes(model: ir.Model) -> None:
    """Give every unnamed node a unique name, so plans and reports can refer to nodes."""
    taken = {n.name for n in model.graph if n.name}
    for i, node in enumerate(model.graph):
        if not node.name:
            name = f"{node.op_type}_{i}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)


def pools_as_convs(model: ir.Model) -> tuple[ir.Model, frozenset[str]]:
    """A copy of ``model`` whose 2-D AveragePools are depthwise Convs with weights ``1/(kh·kw)``,
    and the names of those Convs (``convs_as_pools`` turns those a plan excludes back).

    ONNX Runtime fuses an AveragePool between DequantizeLinear and QuantizeLinear into
    QLinearAveragePool, far slower than the float pool; its depthwise int8 Conv is fast. The same sums over the same
    windows, so exact where the divisor is always ``kh·kw``: no padding, or padding counted
    (``count_include_pad=1``), and no partial windows (``ceil_mode=0``), unit dilations, and a known
    channel count. The weight ``1/(kh·kw)`` quantizes exactly (code 127 with per-channel scales).
    """
    m = copy_model(model)
    g = m.graph
    done = []
    for node in list(g):
        if node.op_type != "AveragePool" or node.domain not in ("", "ai.onnx"):
            continue
        a = node.attributes
        x = node.inputs[0]
        kernel = a.get_ints("kernel_shape", ())
        pads = a.get_ints("pads", (0,) * 2 * len(kernel))
        if (
            len(kernel) != 2
            or x.shape is None
            or len(x.shape) != 4
            or not isinstance(x.shape[1], int)
            or a.get_string("auto_pad", "NOTSET") != "NOTSET"
            or a.get_int("ceil_mode", 0)
            or any(d != 1 for d in a.get_ints("dilations", (1, 1)))
            or (any(pads) and not a.get_int("count_include_pad", 0))
            or not is_float(x)
        ):
            continue
        c = x.shape[1]
        w = np.full((c, 1, *kernel), 1.0 / (kernel[0] * kernel[1]), np.float32)
        conv = ir.node(
            "Conv",
            [x, constant(g, w, f"{node.name}_mean_weight")],
            attributes={
                "group": c,
                "kernel_shape": list(kernel),
                "strides": list(a.get_ints("strides", (1, 1))),
                "pads": list(pads),
            },
            name=node.name,
        )
        swap_node(g, node, [conv], conv.outputs[0])
        done.append(conv.name)
    return m, frozenset(done)


def convs_as_pools(graph: ir.Graph, names: set[str] | frozenset[str]) -> None:
    """Undo ``pools_as_convs`` in place for the Convs named (those a plan left in float, e.g.
    excluded: there the pool is the faster float kernel). Exact: the same windows and divisor."""
    for node in [n for n in graph if n.name in names and n.op_type == "Conv"]:
        a = node.attributes
        pool = ir.node(
            "AveragePool",
            [node.inputs[0]],
            attributes={
                "kernel_shape": list(a.get_ints("kernel_shape")),
                "strides": list(a.get_ints("strides")),
                "pads": list(a.get_ints("pads")),
                "count_include_pad": 1,
            },
            name=node.name,
        )
        swap_node(graph, node, [pool], pool.outputs[0])


def affines_as_convs(model: ir.Model) -> tuple[ir.Model, dict[str, str]]:
    """A copy of ``model`` whose per-channel affines ``x · a (+ b)`` on NCHW activations (a
    BatchNorm the optimizer could not fold: DenseNet's pre-activation one, with a Relu between it
    and its Conv) are depthwise 1x1 Convs, and the name of the Mul each of those Convs comes from
    (``convs_as_affines`` turns those a plan leaves in float back). ONNX Runtime runs the Conv in
    int8 with the following Relu folded in; the Mul and Add would run in float between a
    dequantize and a quantize.

    Only where it adds no quantization point: the affine must read data that is 8-bit already
    (the output of a quantized Conv or Gemm, through scale-sharing ops). An affine on a Concat
    (DenseNet's) is distributed over the Concat's inputs, ``Concat(x_i)·a + b = Concat(x_i·a_i +
    b_i)``, with the Relu after it (and one between the Concat and it, Inception-style), so that
    each piece reads its input at that input's own scale: quantizing the Concat itself would
    squeeze inputs of very different ranges into one scale and cost accuracy. Exact: the same
    products and sums. Many small Convs, but each runs in the 8-bit chain."""
    m = copy_model(model)
    g = m.graph
    quantized = {n.name for n in select_layers(m) if n.op_type in WEIGHT_INPUT}

    def eight_bit(v: ir.Value) -> bool:
        src = through(v, False)[0]
        return src is not None and src.name in quantized

    with bulk_names(g):
        done = _affines_as_convs(g, eight_bit)
    return m, done


def _affines_as_convs(g: ir.Graph, eight_bit) -> dict[str, str]:
    done: dict[str, str] = {}
    for mul in list(g):
        affine = _affine(mul)
        if affine is None:
            continue
        x, a, b, last = affine
        c = a.size
        if c < 16:  # an image's normalisation: int8 depthwise kernels are slow on few channels
            continue
        if eight_bit(x):
            conv = _channel_conv(g, x, a, b, mul.name)
            g.insert_after(last, conv)
            _reserve_nodes(g, [conv])
            _take_over(g, list(dict.fromkeys([mul, last])), conv.outputs[0])
            done[conv.name] = mul.name
            continue
        pieces, before = _concat_pieces(x), None
        pre = x.producer()
        if not pieces and pre is not None and pre.op_type == "Relu" and _only_reader(x, mul):
            # Relu(Concat(x_i)) = Concat(Relu(x_i)): where the Concat is the only reader of each
            # x_i, each Relu folds into the op that writes x_i
            cat_in = pre.inputs[0]
            inner = _concat_pieces(cat_in, nested=False)
            if inner and _only_reader(cat_in, pre) and all(_only_reader(v) for v in inner):
                pieces, before = inner, pre
        if not pieces or not all(eight_bit(v) and v.shape[1] > 1 for v in pieces):
            continue
        relu = relu_after(last)
        if relu is not None and relu.op_type != "Relu":
            relu = None  # a Clip(0, c) stays after the Concat (each piece would need its max)
        convs, outs, start = [], [], 0
        for i, v in enumerate(pieces):
            n = v.shape[1]
            part = slice(start, start + n)
            if before is not None:
                convs.append(_relu(v, unique_name(g, f"{before.name}_part{i}")))
                v = convs[-1].outputs[0]
            convs.append(
                _channel_conv(
                    g,
                    v,
                    a[part],
                    None if b is None else b[part],
                    unique_name(g, f"{mul.name}_part{i}"),
                )
            )
            if relu is not None:
                convs.append(_relu(convs[-1].outputs[0], unique_name(g, f"{relu.name}_part{i}")))
            outs.append(convs[-1].outputs[0])
            start += n
        cat = ir.node(
            "Concat", outs, attributes={"axis": 1}, name=unique_name(g, f"{mul.name}_concat")
        )
        end = relu if relu is not None else last
        g.insert_after(end, [*convs, cat])
        _reserve_nodes(g, [*convs, cat])
        chain = [before, mul, last, end] if before is not None else [mul, last, end]
        _take_over(g, list(dict.fromkeys(chain)), cat.outputs[0])
        done.update({n.name: mul.name for n in convs if n.op_type == "Conv"})
    return done


def _reserve_nodes(g: ir.Graph, nodes: list[ir.Node]) -> None:
    reserve(g, *(n.name for n in nodes), *(o.name for n in nodes for o in n.outputs if o.name))


def _affine(mul: ir.Node) -> tuple[ir.Value, np.ndarray, np.ndarray | None, ir.Node] | None:
    """``(x, a, b, last node)`` when ``mul`` is ``x · a`` with ``a`` per channel of a 4-D NCHW
    activation, followed by ``+ b`` per channel if its only reader adds one."""
    if mul.op_type != "Mul" or mul.domain not in ("", "ai.onnx") or len(mul.inputs) != 2:
        return None
    x, a = mul.inputs[0], const_array(mul.inputs[1])
    if a is None:
        x, a = mul.inputs[1], const_array(mul.inputs[0])
    shape = x.shape if x is not None else None
    c = shape[1] if shape is not None and len(shape) == 4 else None
    if not isinstance(c, int) or not is_activation(x) or not is_channel_constant(a, c):
        return None
    out, b, last = mul.outputs[0], None, mul
    uses = list(out.uses())
    if len(uses) == 1 and not out.is_graph_output() and uses[0].node.op_type == "Add":
        add = uses[0].node
        shift = const_array(add.inputs[1 - uses[0].idx])
        if is_channel_constant(shift, c):
            b, last = shift.reshape(c), add
    return x, a.reshape(c), b, last


def _only_reader(v: ir.Value, node: ir.Node | None = None) -> bool:
    """Whether ``v`` has one reader (``node``, if given) and is not a graph output."""
    uses = list(v.uses())
    return len(uses) == 1 and not v.is_graph_output() and (node is None or uses[0].node is node)


def _relu(x: ir.Value, name: str) -> ir.Node:
    node = ir.node("Relu", [x], name=name)
    node.outputs[0].type, node.outputs[0].shape = x.type, x.shape
    return node


def _concat_pieces(v: ir.Value, *, nested: bool = True) -> list[ir.Value]:
    """The tensors a channel Concat joins, nested Concats flattened (if ``nested``); [] if ``v``
    is not one (or a piece's channel count is unknown)."""
    node = v.producer()
    if (
        node is None
        or node.op_type != "Concat"
        or node.attributes.get_int("axis", 0) not in (1, -3)
    ):
        return []
    pieces = []
    for u in node.inputs:
        if u is None or u.shape is None or len(u.shape) != 4 or not isinstance(u.shape[1], int):
            return []
        inner = _concat_pieces(u) if nested else []
        pieces += inner or [u]
    return pieces


def _channel_conv(
    g: ir.Graph, x: ir.Value, a: np.ndarray, b: np.ndarray | None, name: str
) -> ir.Node:
    """``x · a + b`` per channel as a depthwise 1x1 Conv."""
    c = a.size
    inputs = [x, constant(g, a.reshape(c, 1, 1, 1).astype(np.float32), f"{name}_scale_weight")]
    if b is not None:
        inputs.append(constant(g, b.astype(np.float32), f"{name}_shift"))
    conv = ir.node("Conv", inputs, attributes={"group": c, "kernel_shape": [1, 1]}, name=name)
    conv.outputs[0].type = x.type
    conv.outputs[0].shape = x.shape
    return conv


def _take_over(g: ir.Graph, nodes: list[ir.Node], result: ir.Value) -> None:
    """``result`` replaces the last of ``nodes``' output (its readers and name); then ``nodes``,
    and Concats upstream of them, are removed where nothing else reads them."""
    old = nodes[-1].outputs[0]
    name = old.name
    result.type, result.shape = old.type, old.shape
    replace_value(old, result)
    todo = list(reversed(nodes))
    while todo:
        node = todo.pop(0)
        if node.graph is None or any(o.uses() or o.is_graph_output() for o in node.outputs):
            continue
        ins = [v.producer() for v in node.inputs if v is not None]
        g.remove(node, safe=True)
        todo += [p for p in ins if p is not None and p.op_type == "Concat"]
    result.name = name


def convs_as_affines(graph: ir.Graph, names: set[str] | frozenset[str]) -> None:
    """Undo ``affines_as_convs`` in place for the Convs named (those a plan left in float)."""
    for node in [n for n in graph if n.name in names and n.op_type == "Conv"]:
        c = int(const_array(node.inputs[1]).shape[0])
        scale = constant(graph, const_array(node.inputs[1]).reshape(c, 1, 1), f"{node.name}_scale")
        new = [ir.node("Mul", [node.inputs[0], scale], name=node.name)]
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            shift = constant(
                graph, const_array(node.inputs[2]).reshape(c, 1, 1), f"{node.name}_shift"
            )
            new.append(ir.node("Add", [new[0].outputs[0], shift], name=f"{node.name}_shift"))
            new[0].outputs[0].name = f"{node.name}_scaled"
        swap_node(graph, node, new, new[-1].outputs[0])


class Reversible:
    """An exact rewrite and its inverse. ``forward`` returns a rewritten copy and, for each node
    it made, the name of the float model's node it stands for; ``inverse`` restores, in place,
    the float form of the made nodes named."""

    name: str = ""

    def forward(self, model: ir.Model) -> tuple[ir.Model, dict[str, str]]:  # pragma: no cover
        raise NotImplementedError

    def inverse(self, graph: ir.Graph, made: set[str]) -> None:  # pragma: no cover
        raise NotImplementedError


class PoolsAsConvs(Reversible):
    name = "pools-as-convs"

    def forward(self, model):
        m, done = pools_as_convs(model)
        return m, {conv: conv for conv in done}  # each Conv keeps its pool's name

    def inverse(self, graph, made):
        convs_as_pools(graph, made)


class AffinesAsConvs(Reversible):
    name = "affines-as-convs"

    def forward(self, model):
        return affines_as_convs(model)

    def inverse(self, graph, made):
        convs_as_affines(graph, made)
