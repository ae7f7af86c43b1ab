"""Which eligible nodes static int8 quantizes.

A weighted op is quantized when its reduction is long enough for an int8 kernel to beat the float
one, unless it is a thin RGB stem (the int8 kernel's generic path); a short reduction is kept in
int8 anyway where a float op would cost the chain more (read by a residual Add, depthwise, on 1x1
maps). An op without weights only pays off inside an 8-bit chain.
"""

from __future__ import annotations

import onnx_ir as ir

from modelpress.compress.quantize.layers import (
    WEIGHT_INPUT,
    is_float,
)
from modelpress.compress.quantize.ops import (
    BINARY_OPS,
    eligible,
    is_depthwise,
    passthrough,
    reduction_size,
    relu_after,
    through,
)
from modelpress.ir.match import const_array


def _thin_stem(node: ir.Node) -> bool:
    """A Conv on the graph input with a channel count that is not a multiple of 4 (an image's 3)
    and at most 16 filters: many mobile and small CNNs' stem. ONNX Runtime's int8 kernel then takes
    its generic path; with the input's quantization and transposition it costs more than it saves.
    Not when a pooling or layout op reads it (a VGG's MaxPool): ONNX Runtime would run that on
    8-bit NCHW data, slower still."""
    if node.op_type != "Conv" or node.inputs[0] is None or not node.inputs[0].is_graph_input():
        return False
    w = const_array(node.inputs[1])
    if node.attributes.get_int("group", 1) != 1 or w.shape[1] % 4 == 0 or w.shape[0] > 16:
        return False
    readers, todo = [], [node.outputs[0]]
    while todo:
        for use in todo.pop().uses():
            if use.node.op_type in ("Relu", "Clip"):
                todo.append(use.node.outputs[0])
            else:
                readers.append(use.node)
    return not any(passthrough(r) for r in readers)


def _feeds_add(node: ir.Node) -> bool:
    """Whether an Add of two activations reads ``node``'s output (through Relu/Clip and
    scale-sharing ops): a residual block's shortcut. A short-reduction stem left in float there
    costs more in the layout changes around it than its int8 kernel loses."""
    return any(
        c is not None and c.op_type == "Add" and eligible(c) for c in through(node.outputs[0], True)
    )


def _one_pixel(node: ir.Node) -> bool:
    # A Conv on 1x1 maps (a squeeze-excite's) costs next to nothing in either kernel; in int8 it
    # keeps the excite path in the chain, where a float one would dequantize the feature map.
    shape = node.inputs[0].shape
    return (
        node.op_type == "Conv"
        and shape is not None
        and len(shape) > 2
        and all(isinstance(d, int) and d == 1 for d in shape[2:])
    )


def select_layers(
    model: ir.Model,
    *,
    exclude: frozenset[str] = frozenset(),
    min_reduction: int = 16,
    float_readers: frozenset[str] = frozenset(),
) -> list[ir.Node]:
    """The compute nodes to quantize.

    Weighted ops are quantized when their reduction is long enough for an int8 kernel to beat the
    float one (a 3x3 conv on 1 input channel, reduction 9, runs slower in int8 on x86) and it is
    not a thin RGB stem (``_thin_stem``); whatever their reduction when a residual Add reads them
    (``_feeds_add``), when they are depthwise, and on 1x1 maps, where either kernel costs next to
    nothing and int8 keeps the chain. An op without weights (Add, Mul, pools) only pays off inside
    an 8-bit chain: it is kept while at least one input comes from a quantized op and every
    consumer of its output is a quantized op (or one of ``float_readers``, which read the
    dequantized output on purpose), checked to a fixed point (removing one op can break the chain
    of another).
    """
    nodes = [n for n in model.graph if n.name not in exclude and eligible(n)]
    kept = {
        n.name
        for n in nodes
        if n.op_type not in WEIGHT_INPUT
        or (reduction_size(n) >= min_reduction and not _thin_stem(n))
        or _feeds_add(n)
        or is_depthwise(n)
        or _one_pixel(n)
    }
    changed = True
    while changed:
        changed = False
        for n in nodes:
            if n.name not in kept or n.op_type in WEIGHT_INPUT:
                continue
            n_act = 2 if n.op_type in BINARY_OPS else 1
            sources = [through(v, False)[0] for v in n.inputs[:n_act]]
            consumers = through(n.outputs[0], True)
            fed = any(s is not None and s.name in kept for s in sources)
            feeds = bool(consumers) and all(
                c is not None and (c.name in kept or c.name in float_readers) for c in consumers
            )
            if not (fed and feeds):
                kept.discard(n.name)
                changed = True
    return [n for n in nodes if n.name in kept]


def concats_in_chain(
    model: ir.Model, quantized: set[str] | None, exclude: frozenset[str] = frozenset()
) -> list[ir.Node]:
    """Concats whose float output is read, through scale-sharing ops, only by quantized ops (any
    eligible op when ``quantized`` is None) or by other such Concats, at least one of them behind
    a scale-sharing op; to a fixed point, so that chained shuffles qualify together."""
    candidates = [
        n
        for n in model.graph
        if n.op_type == "Concat"
        and n.name not in exclude
        and is_float(n.outputs[0])
        and not n.outputs[0].is_graph_output()
    ]
    accepted: set[str] = set()

    def ok(c) -> bool:
        if c is None:
            return False
        if c.name in accepted:
            return True
        return c.name in quantized if quantized is not None else eligible(c)

    changed = True
    while changed:
        changed = False
        for n in candidates:
            if n.name in accepted:
                continue
            consumers = through(n.outputs[0], True, folds=False)
            direct = {use.node.name for use in n.outputs[0].uses()}
            if (
                consumers
                and all(ok(c) for c in consumers)
                and any(c.name not in direct for c in consumers)
            ):
                accepted.add(n.name)
                changed = True
    return [n for n in candidates if n.name in accepted]


def observable(model: ir.Model) -> set[str]:
    """Every float tensor some plan of ``model`` may wrap, whatever is excluded: the activation
    inputs and outputs of eligible ops, a Relu/Clip folded after them, and what scale-sharing ops
    make of those. Calibrating these once serves every plan the accuracy budget tries."""
    names: set[str] = set()
    for node in model.graph:
        if not eligible(node):
            continue
        n_act = 2 if node.op_type in BINARY_OPS else 1
        names.update(v.name for v in node.inputs[:n_act] if is_float(v))
        y = node.outputs[0]
        if is_float(y):
            names.add(y.name)
            relu = relu_after(node)
            if relu is not None:
                names.add(relu.outputs[0].name)
    names.update(n.outputs[0].name for n in concats_in_chain(model, None))
    for node in model.graph:  # in graph order, so chains of scale-sharing ops propagate
        if passthrough(node) and node.inputs and node.inputs[0] is not None:
            if node.inputs[0].name in names and is_float(node.outputs[0]):
                names.add(node.outputs[0].name)
    return names
