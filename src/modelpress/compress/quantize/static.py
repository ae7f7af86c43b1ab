"""Static (full) int8 quantization in standard QDQ form, calibrated on data.

Rule: for every op that has an int8 kernel in ONNX Runtime (Conv, Gemm and MatMul with constant
weights; Add and Mul of two activations; global average pools, Sigmoid, LeakyRelu; HardSigmoid and
HardSwish, written as an Add and a Mul), its activation inputs and its output pass through
``QuantizeLinear → DequantizeLinear`` pairs and its weights through ``DequantizeLinear`` of
int8 constants. ONNX Runtime's QDQ fusion turns each such group into one integer kernel
(QLinearConv, QGemm, QLinearMatMul, QLinearAdd, ...), so a chain of quantized ops stays in 8 bits
from the first Q to the last DQ. Ops without an int8 kernel are left alone: wrapping them would only
add conversions. Formats follow what x86 VNNI kernels are fast for: uint8 asymmetric activations,
int8 symmetric per-channel weights, int32 biases with ``scale = scale_x · scale_w``.

These rewrites keep the chain in 8 bits, and fast:
- a Relu (or ``Clip(0, c)``) right after a quantized op is dropped and its range becomes the
  op's output range: with a zero point at the lowest code, QuantizeLinear's saturation is the Relu;
- layout and selection ops (MaxPool, Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Slice,
  DepthToSpace, nearest-neighbour Resize) share the scale of their input, so ONNX Runtime drops their Q/DQ and runs them on the 8-bit data;
- Concat inputs used only by the Concat take the Concat's output scale (one scale for all), and a
  Concat read only through such ops by quantized ops is quantized itself (a channel shuffle);
- a per-channel affine the optimizer could not fold (DenseNet's BatchNorm after a Concat) becomes
  depthwise 1x1 Convs, one per Concat input (``affines_as_convs``);
- a depthwise Conv whose channel count is not a multiple of 16 gets channels up to one (copies of
  a real one that no output reads), and so do the ops around it (``padding.pad_depthwise``): ONNX
  Runtime's fast int8 depthwise kernel needs it, and runs about twice as fast as its fallback.
A classifier head (a Gemm or MatMul on pooled features that writes the outputs, at most 1% of
the multiply-adds and 5% of the weights) stays float when 8-bit inputs would move its outputs by more than 2% of their
spread on the calibration data (``head_candidates``, ``head_input_errors``): nothing after it
averages that rounding out. The global pool before it then runs in float on the dequantized map
and the ops before that stay in the chain; with float weights, the head costs next to nothing
(a 1000-class head whose int8 weights were dequantized at every run cost MobileNetV2 a fifth of
its time).
Graph outputs stay float: the last quantized op dequantizes into them (a Conv through its own Q/DQ:
ONNX Runtime has no int8 Conv with a float output); so does an output read by a
layer that is kept in float on purpose (``exclude``), and the output of a MatMul/Gemm that no
quantized op reads (ONNX Runtime runs it as MatMulIntegerToFloat / QGemm with a float output).

On attention-like graphs (Softmax, LayerNormalization) activation outliers are first moved into the
weights (``smoothing``), as for dynamic quantization: with both rules MiniLM keeps a mean cosine of
0.998 in static int8, against 0.94 with neither.

What ONNX Runtime (CPU, all optimizations) makes of it, checked by ``tests/compress/
test_static_graph.py``: every DequantizeLinear is fused, the only QuantizeLinear left is the one
entering the chain, and the int8 kernels run in NHWC with one Transpose in and one out. A weighted op
with a short reduction (a 1-channel 3x3 stem: its int8 kernel measured 3-4x slower than the float
one) stays float, unless its output feeds a residual Add: in float it would cost the Add more
Transposes than its int8 kernel loses (``_feeds_add``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from modelpress.compress.quantize.layers import (
    WEIGHT_INPUT,
    constant,
    is_channel_constant,
    is_float,
    output_channel_axis,
    plain_linear,
    scalar_or_vector,
)
from modelpress.compress.quantize.qparams import (
    PerChannel,
    PerTensor,
    QParams,
    quantize,
    weight_qparams,
)
from modelpress.ir.graph import (
    bulk_names,
    copy_model,
    remove_unused_initializers,
    replace_value,
    reserve,
    swap_node,
    taken_names,
    unique_name,
)
from modelpress.ir.match import const_array, values_by_name

# Ops with two activation inputs that ONNX Runtime runs in int8 (QLinearAdd, QLinearMul).
BINARY_OPS = {"Add", "Mul"}
# Ops with one activation input and an int8 kernel.
# (Not AveragePool: ONNX Runtime's QLinearAveragePool measured 10x slower than the float kernel.)
# HardSigmoid and HardSwish have none, but are written as ops that do (``_expand_hard``).
HARD_OPS = {"HardSigmoid", "HardSwish"}
UNARY_OPS = {"GlobalAveragePool", "Sigmoid", "LeakyRelu"} | HARD_OPS
# Ops that move or select values without arithmetic: they share their input's scale.
PASSTHROUGH_OPS = {
    "MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Slice",
    "DepthToSpace", "Resize",
}  # fmt: skip


# Ops that read only their input's shape.
SHAPE_ONLY_OPS = {"Shape", "Size"}


def _passthrough(node: ir.Node) -> bool:
    """Whether ``node`` only moves or selects values (Resize: nearest-neighbour only)."""
    if node.op_type == "Resize":
        return node.attributes.get_string("mode", "nearest") == "nearest"
    return node.op_type in PASSTHROUGH_OPS


@dataclass
class StaticPlan:
    """What to quantize, decided on the float model (node names are stable across copies)."""

    layers: list[str] = field(default_factory=list)  # quantized compute nodes, in graph order
    folds: dict[str, str] = field(default_factory=dict)  # compute node → Relu/Clip node it absorbs
    # tensor to wrap in Q/DQ (name after folding) → tensor of the float model whose range sets it
    tensors: dict[str, str] = field(default_factory=dict)
    # Concat output → its inputs, as (tensor carrying it after folding, tensor the Concat reads)
    concat_groups: list[tuple[str, list[tuple[str, str]]]] = field(default_factory=list)
    # graph outputs written by a Conv: the output itself becomes the DQ (ONNX Runtime has no int8
    # Conv with a float output); every other graph output stays the float value
    requantized_outputs: set[str] = field(default_factory=set)
    # classifier heads kept float (``head_candidates``); bias correction still reaches them
    float_heads: list[str] = field(default_factory=list)

    @property
    def observed(self) -> list[str]:
        return sorted(set(self.tensors.values()))


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
    QLinearAveragePool, measured 10x slower than the float pool (an Inception branch's 3x3 pool cost
    more than all its convolutions); its depthwise int8 Conv is fast. The same sums over the same
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
    squeeze inputs of very different ranges into one scale (tried: 1-1.5 points of accuracy lost
    on small CNNs). Exact: the same products and sums. On DenseNet-121 this is about 600 small
    Convs, still 0.61x → 0.44x of float32's time at batch 1."""
    m = copy_model(model)
    g = m.graph
    quantized = {n.name for n in select_layers(m) if n.op_type in WEIGHT_INPUT}

    def eight_bit(v: ir.Value) -> bool:
        src = _through(v, False)[0]
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
        relu = _relu_after(last)
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
    if not isinstance(c, int) or not _activation(x) or not is_channel_constant(a, c):
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


def _activation(v: ir.Value | None) -> bool:
    return is_float(v) and const_array(v) is None and not v.is_initializer()


def eligible(node: ir.Node) -> bool:
    """Whether ``node`` is an op this mode quantizes, with the inputs its int8 kernel accepts."""
    if node.domain not in ("", "ai.onnx"):
        return False
    op = node.op_type
    if op in WEIGHT_INPUT:
        if len(node.inputs) <= 1 or not _activation(node.inputs[0]):
            return False
        w = const_array(node.inputs[1])
        if w is None or w.dtype != np.float32 or w.ndim < 2 or (op == "MatMul" and w.ndim != 2):
            return False
        return plain_linear(node)
    if op in BINARY_OPS:
        return len(node.inputs) == 2 and all(_activation(v) for v in node.inputs)
    if op == "HardSigmoid" and node.attributes.get_float("alpha", 0.2) <= 0:
        return False  # _expand_hard reads the input at α times its scale: α must be positive
    if op in UNARY_OPS:
        return _activation(node.inputs[0])
    return False


def _relu_after(node: ir.Node) -> ir.Node | None:
    """The Relu or Clip(min=0) that is the only consumer of ``node``'s output, if any."""
    y = node.outputs[0]
    uses = list(y.uses())
    if len(uses) != 1 or y.is_graph_output():
        return None
    nxt = uses[0].node
    if nxt.outputs[0].is_graph_output():
        return None
    if nxt.op_type == "Relu":
        return nxt
    if nxt.op_type == "Clip" and len(nxt.inputs) >= 2:
        lo = const_array(nxt.inputs[1])
        if lo is not None and lo.size == 1 and float(lo) == 0.0:
            return nxt
    return None


def _reduction_size(node: ir.Node) -> int:
    """Multiply-adds per output element: ``C_in / group · kh · kw`` for Conv, ``K`` for MatMul."""
    w = const_array(node.inputs[1])
    if node.op_type == "Conv":
        return int(np.prod(w.shape[1:]))
    return int(
        w.shape[1]
        if node.op_type == "Gemm" and node.attributes.get_int("transB", 0)
        else w.shape[0]
    )


def _depthwise(node: ir.Node) -> bool:
    # Depthwise convolutions have their own int8 kernel, fast despite a reduction of only kh·kw.
    return (
        node.op_type == "Conv"
        and node.attributes.get_int("group", 1) > 1
        and const_array(node.inputs[1]).shape[1] == 1
    )


def _thin_stem(node: ir.Node) -> bool:
    """A Conv on the graph input with a channel count that is not a multiple of 4 (an image's 3)
    and at most 16 filters: MobileNetV3's and many small CNNs' stem. ONNX Runtime's int8 kernel
    then takes its generic path; with the input's quantization and transposition it cost more than
    all it saved (MobileNetV3-Small at batch 1: 1.21x float32 with it in int8, 1.04x in float).
    Not when a pooling or layout op reads it (a VGG's MaxPool): ONNX Runtime would run that on
    8-bit NCHW data, slower still (1.7x float32 in total on a small VGG)."""
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
    return not any(_passthrough(r) for r in readers)


def _feeds_add(node: ir.Node) -> bool:
    """Whether an Add of two activations reads ``node``'s output (through Relu/Clip and
    scale-sharing ops): a residual block's shortcut. A short-reduction stem left in float there
    cost more in Transposes than its int8 kernel loses (ResNet-style digits CNN, 1-channel 3x3
    stem: 1.01x float32 at batch 1 with the stem in float, 0.96x in int8; 0.95x and 0.92x at
    batch 8)."""
    return any(
        c is not None and c.op_type == "Add" and eligible(c)
        for c in _through(node.outputs[0], True)
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


def _through(value: ir.Value, forward: bool, *, folds: bool = True) -> list:
    """Walk through scale-sharing ops, and Relu/Clip folds unless ``folds`` is off: the producer
    (backward) or the consumers (forward, None for a graph output) that really see ``value``'s
    8-bit form."""
    skip = ("Relu", "Clip") if folds else ()
    if not forward:
        node = value.producer()
        while node is not None and (_passthrough(node) or node.op_type in skip):
            node = node.inputs[0].producer() if node.inputs[0] is not None else None
        return [node]
    out: list = [None] if value.is_graph_output() else []
    for use in value.uses():
        n = use.node
        if use.idx == 0 and (_passthrough(n) or n.op_type in skip):
            out.extend(_through(n.outputs[0], True, folds=folds))
        else:
            out.append(n)
    return out


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
        or (_reduction_size(n) >= min_reduction and not _thin_stem(n))
        or _feeds_add(n)
        or _depthwise(n)
        or _one_pixel(n)
    }
    changed = True
    while changed:
        changed = False
        for n in nodes:
            if n.name not in kept or n.op_type in WEIGHT_INPUT:
                continue
            n_act = 2 if n.op_type in BINARY_OPS else 1
            sources = [_through(v, False)[0] for v in n.inputs[:n_act]]
            consumers = _through(n.outputs[0], True)
            fed = any(s is not None and s.name in kept for s in sources)
            feeds = bool(consumers) and all(
                c is not None and (c.name in kept or c.name in float_readers) for c in consumers
            )
            if not (fed and feeds):
                kept.discard(n.name)
                changed = True
    return [n for n in nodes if n.name in kept]


# A head may stay float when it does at most this share of the model's multiply-adds (no speed
# to lose), and holds at most this share of its weights (the file grows by a fifth at most).
HEAD_MAX_SHARE = 0.01
HEAD_MAX_WEIGHTS = 0.05


def _macs(node: ir.Node) -> int | None:
    """Multiply-adds of a weighted node per unit of its symbolic dimensions (a batch of one),
    or None when its output shape is unknown."""
    shape = node.outputs[0].shape
    if shape is None:
        return None
    return int(np.prod([d if isinstance(d, int) else 1 for d in shape])) * _reduction_size(node)


def head_candidates(model: ir.Model) -> list[str]:
    """The classifier heads that may stay float: Gemms and MatMuls on a 2-D input (pooled
    features) whose output reaches no other weighted op, that cost at most ``HEAD_MAX_SHARE`` of
    the model's multiply-adds and hold at most ``HEAD_MAX_WEIGHTS`` of its weights (an ImageNet
    head on a small backbone, MobileNetV2's or DenseNet-121's, does not qualify). Which of them
    do is measured on the calibration data (``head_input_errors``, in static mode)."""
    from modelpress.compress.quantize.bias_correction import last_layers

    weighted = [n for n in model.graph if n.op_type in WEIGHT_INPUT and eligible(n)]
    macs = [_macs(n) for n in weighted]
    if not weighted or any(m is None for m in macs):
        return []
    cost = {n.name: m for n, m in zip(weighted, macs, strict=True)}
    size = {n.name: const_array(n.inputs[1]).size for n in weighted}
    return [
        n.name
        for n in last_layers(model, weighted, ops=("Gemm", "MatMul"))
        if n.inputs[0].shape is not None
        and len(n.inputs[0].shape) == 2
        and cost[n.name] <= HEAD_MAX_SHARE * sum(macs)
        and size[n.name] <= HEAD_MAX_WEIGHTS * sum(size.values())
    ]


def head_input_errors(
    model: ir.Model,
    heads: list[str],
    qparams: dict[str, QParams],
    tensors: dict[str, str],
    batches: list[dict[str, np.ndarray]],
    *,
    centred: bool = False,
) -> dict[str, float]:
    """How far rounding each head's input to 8 bits moves its outputs: ``‖(x̂ − x)·W‖`` over
    ``‖(x − x̄)·W‖``, the outputs' spread across the samples (what tells classes apart), on
    ``batches``; ``centred``: without the mean shift, which bias correction takes out.
    ``tensors`` maps a tensor to the one whose range sets its scale (a plan's). A head whose
    outputs barely vary across the samples (a spread under 1% of their size, as with random
    weights or one kind of input) is left out: the data cannot tell."""
    from modelpress.compress.quantize.qparams import fake_quantize
    from modelpress.compress.quantize.sensitivity import runner
    from modelpress.compress.quantize.smoothing import kn_weight

    by = {n.name: n for n in model.graph}
    inputs = {h: by[h].inputs[0].name for h in heads}
    inputs = {h: x for h, x in inputs.items() if tensors.get(x, x) in qparams}
    if not inputs or not batches:
        return {}
    run = runner(model, outputs=set(inputs.values()), optimize="disabled")
    seen: dict[str, list[np.ndarray]] = {h: [] for h in inputs}
    for feeds in batches:
        got = run(feeds)
        for h, x in inputs.items():
            seen[h].append(got[x].astype(np.float64))
    out = {}
    for h, x in inputs.items():
        xs = np.concatenate(seen[h])
        w = kn_weight(by[h]).astype(np.float64)
        moved = (fake_quantize(xs, qparams[tensors.get(x, x)]) - xs) @ w
        moved = np.linalg.norm(moved - moved.mean(axis=0) if centred else moved)
        spread = np.linalg.norm((xs - xs.mean(axis=0)) @ w)
        if spread >= 0.01 * np.linalg.norm(xs @ w):
            out[h] = float(moved / spread)
    return out


def plan(
    model: ir.Model,
    *,
    exclude: frozenset[str] = frozenset(),
    asymmetric: bool = True,
    activations: str = "uint8",
    min_reduction: int = 16,
    heads: frozenset[str] = frozenset(),
) -> StaticPlan:
    """``asymmetric``: activations' zero points sit at their range's lowest code, so that a range
    starting at 0 saturates like a Relu (folded into the op before it) and like HardSigmoid's lower
    clip (``_expand_hard``). With symmetric activations neither holds: Relus stay, and so do
    HardSigmoid and HardSwish, in float. So they do with int8 ``activations``: ONNX Runtime (x86)
    then fuses neither the Add nor the Mul they are written as, which would only add work.

    ``heads`` (of ``head_candidates``) stay float, and the op computing their input too."""
    p = StaticPlan()
    alias: dict[str, str] = {}  # float tensor name → tensor that carries it after folding
    if not asymmetric or activations != "uint8":
        exclude = exclude | {n.name for n in model.graph if n.op_type in HARD_OPS}
    # A float head's input is computed in float too (a global pool, through Flatten, runs on the
    # dequantized map); the ops before it stay in the chain.
    heads = frozenset(heads - exclude)
    p.float_heads = [n.name for n in model.graph if n.name in heads]
    pools = {_through(v, False)[0] for n in model.graph if n.name in heads for v in n.inputs[:1]}
    pools = frozenset(n.name for n in pools if n is not None and n.op_type not in WEIGHT_INPUT)
    selected = select_layers(
        model,
        exclude=exclude | heads | pools,
        min_reduction=min_reduction,
        float_readers=pools,
    )
    names = {n.name for n in selected}
    for node in selected:
        p.layers.append(node.name)
        n_act = 2 if node.op_type in BINARY_OPS else 1
        for v in node.inputs[:n_act]:
            p.tensors.setdefault(alias.get(v.name, v.name), v.name)
        y = node.outputs[0]
        if not is_float(y):
            continue
        if y.is_graph_output():
            # ONNX Runtime has no int8 Conv with a float output: without Q/DQ it would run the
            # float kernel on weights dequantized at every run. MatMul/Gemm write float directly.
            if node.op_type == "Conv":
                p.tensors[y.name] = y.name
                p.requantized_outputs.add(y.name)
            continue
        consumers = _through(y, True)
        # A consumer kept in float on purpose (user or accuracy budget) must see the float output,
        # unless a Conv writes it: ONNX Runtime would then run the Conv in float on weights
        # dequantized at every run; the consumer reads the dequantized output instead.
        if node.op_type != "Conv" and any(c is not None and c.name in exclude for c in consumers):
            continue
        # A MatMul/Gemm read only by float ops keeps a float output (ONNX Runtime: QGemm /
        # MatMulIntegerToFloat): requantizing, e.g. a transformer's outlier-heavy projections
        # before the residual Add, would only add error and a conversion.
        if node.op_type in ("MatMul", "Gemm") and not any(
            c is not None and c.name in names for c in consumers
        ):
            continue
        relu = _relu_after(node) if asymmetric else None
        if relu is not None:
            p.folds[node.name] = relu.name
            alias[relu.outputs[0].name] = y.name
            p.tensors[y.name] = relu.outputs[0].name
        else:
            p.tensors[y.name] = y.name
    # A Concat whose output reaches only quantized ops, through scale-sharing ops (ShuffleNet's
    # channel shuffle: Concat → Reshape → Transpose → Reshape → Slice → Conv), is quantized at
    # its own output, so that the shuffle runs on 8-bit data (QLinearConcat) instead of
    # dequantizing into it and quantizing after it.
    for node in _concats_in_chain(model, names, exclude):
        p.tensors.setdefault(node.outputs[0].name, node.outputs[0].name)
    # Scale sharing, in graph order so that chains (MaxPool → Reshape → ...) propagate.
    for node in model.graph:
        if node.name in exclude:
            continue
        x = node.inputs[0] if node.inputs else None
        if x is None or not node.outputs:
            continue
        src = alias.get(x.name, x.name)
        y = node.outputs[0]
        if _passthrough(node) and src in p.tensors and not y.is_graph_output() and is_float(y):
            p.tensors[y.name] = p.tensors[src]
            alias.setdefault(y.name, y.name)
        elif node.op_type == "Concat" and y.name in p.tensors:
            ins = [(alias.get(v.name, v.name), v.name) for v in node.inputs if v is not None]
            p.concat_groups.append((y.name, ins))
    return p


def _concats_in_chain(
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
            consumers = _through(n.outputs[0], True, folds=False)
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
            relu = _relu_after(node)
            if relu is not None:
                names.add(relu.outputs[0].name)
    names.update(n.outputs[0].name for n in _concats_in_chain(model, None))
    for node in model.graph:  # in graph order, so chains of scale-sharing ops propagate
        if _passthrough(node) and node.inputs and node.inputs[0] is not None:
            if node.inputs[0].name in names and is_float(node.outputs[0]):
                names.add(node.outputs[0].name)
    return names


def _resolve_concat(p: StaticPlan, qp: dict[str, QParams], model: ir.Model) -> None:
    """A Concat input read by nothing else takes the Concat's scale (ONNX Runtime's QLinearConcat
    then copies bytes). Not when the input carries a folded Relu and the Concat's range goes below
    zero (the fold needs its own range to start at 0), nor when a scale-sharing op writes it."""
    vals = values_by_name(model.graph)
    folded = set(p.folds.values())
    for out, ins in p.concat_groups:
        if out not in qp:
            continue
        for carrier, read in ins:
            v = vals.get(read)
            if carrier not in qp or v is None or len(v.uses()) != 1 or v.is_graph_output():
                continue
            producer = v.producer()
            relu_fold = producer is not None and producer.name in folded
            if relu_fold and float(np.min(qp[out].range[0])) != 0.0:
                continue
            if producer is not None and _passthrough(producer):
                continue  # it shares its own input's scale (QLinearConcat requantizes it)
            qp[carrier] = qp[out]


def _insert_qdq(
    graph: ir.Graph, value: ir.Value, qp: QParams, *, output_too: bool = False
) -> ir.Value:
    """``value → Q → DQ``; every consumer of ``value`` now reads the DQ, and so does the graph
    output ``value`` is, when ``output_too`` (which keeps the output's name)."""
    scale = constant(graph, scalar_or_vector(qp.scale), f"{value.name}_scale")
    zp = constant(graph, scalar_or_vector(qp.zero_point), f"{value.name}_zero_point")
    q = ir.node("QuantizeLinear", [value, scale, zp], name=f"{value.name}_Q")
    dq = ir.node("DequantizeLinear", [q.outputs[0], scale, zp], name=f"{value.name}_DQ")
    q.outputs[0].name = f"{value.name}_quantized"
    q.outputs[0].type = ir.TensorType(ir.DataType.from_numpy(qp.zero_point.dtype))
    q.outputs[0].shape = value.shape
    dq.outputs[0].name = f"{value.name}_dequantized"
    dq.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
    dq.outputs[0].shape = value.shape
    reserve(graph, q.name, dq.name, q.outputs[0].name, dq.outputs[0].name, f"{value.name}_float")
    uses = list(value.uses())
    producer = value.producer()
    if producer is not None:
        graph.insert_after(producer, [q, dq])
    else:
        graph.insert_before(next(iter(graph)), [q, dq])
    for use in uses:
        if use.node is q:
            continue
        # an op that reads only the shape reads the 8-bit tensor: ONNX Runtime gives every reader
        # of a DequantizeLinear its own copy, and would dequantize a whole feature map for it
        # (a dynamo-exported GroupNorm's Shape: 0.1-0.4 ms per Conv at batch 8)
        reads = q.outputs[0] if use.node.op_type in SHAPE_ONLY_OPS else dq.outputs[0]
        use.node.replace_input_with(use.idx, reads)
    if output_too and value.is_graph_output() and producer is not None:
        name = value.name
        value.name = f"{name}_float"
        dq.outputs[0].name = name
        graph.outputs[:] = [dq.outputs[0] if v is value else v for v in graph.outputs]
    return dq.outputs[0]


def _dq_constant(graph: ir.Graph, q: np.ndarray, qp: QParams, hint: str) -> ir.Value:
    """``DequantizeLinear`` of the integer constant ``q``. Names derive from ``hint`` and are
    unique: an initializer several nodes share (exporters deduplicate equal tensors, such as
    zero biases) gets one DQ per reader, each with its own scale."""
    taken = taken_names(graph)
    base, k = hint, 0
    while any(
        f"{hint}_{s}" in taken for s in ("quantized", "scale", "zero_point", "DQ", "dequantized")
    ):
        k += 1
        hint = f"{base}_{k}"
    qv = constant(graph, q, f"{hint}_quantized")
    scale = constant(graph, scalar_or_vector(qp.scale), f"{hint}_scale")
    zp = constant(graph, scalar_or_vector(qp.zero_point), f"{hint}_zero_point")
    attrs = {} if qp.axis is None or qp.scale.size == 1 else {"axis": qp.axis}
    if qp.block_size:
        attrs["block_size"] = qp.block_size
    dq = ir.node("DequantizeLinear", [qv, scale, zp], attributes=attrs, name=f"{hint}_DQ")
    dq.outputs[0].name = f"{hint}_dequantized"
    reserve(graph, f"{hint}_DQ", f"{hint}_dequantized")
    dq.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
    dq.outputs[0].shape = ir.Shape(q.shape)
    graph.insert_before(next(iter(graph)), dq)
    return dq.outputs[0]


def quantize_weight_input(
    graph: ir.Graph,
    node: ir.Node,
    *,
    per_channel: bool,
    dtype: str = "int8",
    input_scale: float | None = None,
    bias_delta: np.ndarray | None = None,
    rounded: tuple[np.ndarray, QParams] | None = None,
) -> tuple[QParams, np.ndarray]:
    """Replace the node's weight (and, given the input scale, its bias) by DQ of integer constants.

    Returns the weight's qparams and the dequantized weight. ``bias_delta`` is subtracted from the
    bias first (bias correction). ``rounded``: the weight's codes and QParams, chosen ahead (GPTQ);
    otherwise it is rounded to nearest.
    """
    idx = WEIGHT_INPUT[node.op_type]
    w = const_array(node.inputs[idx])
    if rounded is not None:
        wq, wqp = rounded
    else:
        gran = PerChannel(output_channel_axis(node)) if per_channel else PerTensor()
        wqp = weight_qparams(w, gran, dtype=dtype, symmetric=True)
        wq = quantize(w, wqp)
    base = node.inputs[idx].name or f"{node.name}_W"
    node.replace_input_with(idx, _dq_constant(graph, wq, wqp, base))
    b = _corrected_bias(graph, node, bias_delta, w)
    if b is not None:
        if input_scale is None:
            _float_bias(graph, node, b)
        else:
            bscale = (np.float64(input_scale) * np.broadcast_to(wqp.scale, b.shape)).astype(
                np.float32
            )
            bscale = np.maximum(bscale, np.float32(1e-12))
            bq = np.clip(np.rint(b / bscale), -(2**31) + 1, 2**31 - 1).astype(np.int32)
            # per-tensor weights give the bias one scale too (no axis: DequantizeLinear-10 has none)
            one = wqp.scale.size == 1
            bqp = QParams(
                scale=bscale[:1].reshape(()) if one else bscale,
                zero_point=np.zeros(() if one else b.shape, np.int32),
                dtype="int32",
                axis=None if one else 0,
            )
            node.replace_input_with(
                2, _dq_constant(graph, bq, bqp, node.inputs[2].name or f"{node.name}_B")
            )
    return wqp, (wq.astype(np.float32) - _bcast(wqp.zero_point, wqp, w.ndim)) * _bcast(
        wqp.scale, wqp, w.ndim
    )


def _corrected_bias(
    graph: ir.Graph, node: ir.Node, delta: np.ndarray | None, weight: np.ndarray
) -> np.ndarray | None:
    """The bias of a Conv/Gemm (float ``weight``) minus ``delta``, in float64; a zero bias is
    added for a delta to go into. None when it has none and needs none."""
    if node.op_type not in ("Conv", "Gemm"):
        return None
    if len(node.inputs) < 3 or node.inputs[2] is None:
        if delta is None:
            return None
        node.resize_inputs(3)  # Gemm's output channels: axis 0 with transB, else 1
        zeros = np.zeros(weight.shape[output_channel_axis(node)], np.float32)
        node.replace_input_with(2, constant(graph, zeros, f"{node.name}_B"))
    b = const_array(node.inputs[2]).astype(np.float64)
    return b - delta if delta is not None else b


def _float_bias(graph: ir.Graph, node: ir.Node, b: np.ndarray) -> None:
    node.replace_input_with(2, constant(graph, b.astype(np.float32), f"{node.name}_B_corrected"))


def _expand_hard(graph: ir.Graph, node: ir.Node) -> None:
    """HardSigmoid / HardSwish, whose input already passes through Q/DQ, rewritten as ops with
    int8 kernels. ``HardSigmoid(x) = clip(αx + β, 0, 1)``: the 8-bit ``x`` read through a second
    DequantizeLinear whose scale is multiplied by α, plus β, is an Add (QLinearAdd), and the clip
    is the saturation of the output's QuantizeLinear, whose range lies within [0, 1]. HardSwish is
    ``x · HardSigmoid(x)``: that Add, quantized on the exact [0, 1] grid, then a Mul (QLinearMul).
    ONNX Runtime has no int8 kernel for either op: left in float, each needs a dequantize, two
    float passes and a quantize."""
    dq = node.inputs[0].producer()
    assert dq is not None and dq.op_type == "DequantizeLinear", node.name
    alpha = node.attributes.get_float("alpha", 0.2 if node.op_type == "HardSigmoid" else 1 / 6)
    beta = node.attributes.get_float("beta", 0.5)
    x_scale = const_array(dq.inputs[1])
    scaled = constant(
        graph, (x_scale * np.float32(alpha)).astype(np.float32), f"{node.name}_alpha_scale"
    )
    dq_alpha = ir.node(
        "DequantizeLinear", [dq.inputs[0], scaled, dq.inputs[2]], name=f"{node.name}_alpha"
    )
    act = const_array(dq.inputs[2]).dtype  # uint8 or int8: ONNX Runtime fuses only one type
    # β as an 8-bit constant: one code of a scale |β| (its zero point gives the sign)
    code, zp, scale = (1, 0, beta) if beta > 0 else ((0, 1, -beta) if beta < 0 else (0, 0, 1.0))
    dq_beta = ir.node(
        "DequantizeLinear",
        [
            constant(graph, np.array(code, act), f"{node.name}_beta_quantized"),
            constant(graph, np.array(scale, np.float32), f"{node.name}_beta_scale"),
            constant(graph, np.array(zp, act), f"{node.name}_beta_zero_point"),
        ],
        name=f"{node.name}_beta",
    )
    add = ir.node("Add", [dq_alpha.outputs[0], dq_beta.outputs[0]], name=f"{node.name}_add")
    for n in (dq_alpha, dq_beta, add):
        n.outputs[0].name = f"{n.name}_output"
        n.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
    add.outputs[0].shape = node.inputs[0].shape
    reserve(graph, *(n.name for n in (dq_alpha, dq_beta, add)))
    reserve(graph, f"{node.name}_mul", *(n.outputs[0].name for n in (dq_alpha, dq_beta, add)))
    if node.op_type == "HardSigmoid":
        swap_node(graph, node, [dq_alpha, dq_beta, add], add.outputs[0])
        if not dq.outputs[0].uses() and not dq.outputs[0].is_graph_output():
            graph.remove(dq, safe=True)  # the Add reads the 8-bit input through its own DQ
        return
    mul = ir.node("Mul", [node.inputs[0], add.outputs[0]], name=f"{node.name}_mul")
    swap_node(graph, node, [dq_alpha, dq_beta, add, mul], mul.outputs[0])
    lowest = np.iinfo(act).min  # [0, 1] on all 256 codes
    unit = QParams(
        scale=np.array(1 / 255, np.float32), zero_point=np.array(lowest, act), dtype=act.name
    )
    _insert_qdq(graph, add.outputs[0], unit)


def _bcast(p: np.ndarray, qp: QParams, ndim: int) -> np.ndarray:
    if qp.axis is None or p.size == 1:
        return p.astype(np.float32)
    shape = [1] * ndim
    shape[qp.axis] = -1
    return p.astype(np.float32).reshape(shape)


def apply(
    model: ir.Model,
    p: StaticPlan,
    qparams: dict[str, QParams],
    *,
    per_channel: bool = True,
    weight_dtype: str = "int8",
    bias_deltas: dict[str, np.ndarray] | None = None,
    rounded: dict[str, tuple[np.ndarray, QParams]] | None = None,
) -> ir.Model:
    """A quantized copy of ``model``: ``qparams`` maps each observed (float) tensor to its QParams;
    ``rounded`` gives the weight codes of some layers (by node name, ``gptq.round_layers``)."""
    m = copy_model(model)
    with bulk_names(m.graph):
        _apply(m, p, qparams, per_channel, weight_dtype, bias_deltas, rounded or {})
    return m


def _apply(m, p, qparams, per_channel, weight_dtype, bias_deltas, rounded) -> None:
    g = m.graph
    by_name = {n.name: n for n in g}
    by_tensor = {
        name: qparams[stats] if stats in qparams else qparams[name]
        for name, stats in p.tensors.items()
    }
    _resolve_concat(p, by_tensor, m)
    for node_name, relu_name in p.folds.items():
        qp = by_tensor[by_name[node_name].outputs[0].name]
        # The fold is exact only when the lowest code is 0.0: then saturation clips like Relu.
        # plan() folds only for asymmetric activations, whose range then starts at 0.
        assert float(np.min(qp.range[0])) == 0.0, node_name
        relu = by_name[relu_name]
        y = by_name[node_name].outputs[0]
        for use in list(relu.outputs[0].uses()):
            use.node.replace_input_with(use.idx, y)
        g.remove(relu, safe=True)
    layer_inputs = {n: by_name[n].inputs[0].name for n in p.layers}
    vals = values_by_name(g)
    for name, qp in by_tensor.items():
        _insert_qdq(g, vals[name], qp, output_too=name in p.requantized_outputs)
    for node_name in p.layers:
        node = by_name[node_name]
        if node.op_type in HARD_OPS:
            _expand_hard(g, node)
        if node.op_type not in WEIGHT_INPUT:
            continue
        x_qp = by_tensor.get(layer_inputs[node_name])
        scale = float(x_qp.scale) if x_qp is not None else None
        quantize_weight_input(
            g,
            node,
            per_channel=per_channel,
            dtype=weight_dtype,
            input_scale=scale,
            bias_delta=(bias_deltas or {}).get(node_name),
            rounded=rounded.get(node_name),
        )
    for node_name in p.float_heads:  # float weights; the measured shift still corrected
        delta = (bias_deltas or {}).get(node_name)
        node = by_name[node_name]
        w = const_array(node.inputs[WEIGHT_INPUT[node.op_type]])
        if delta is not None and (b := _corrected_bias(g, node, delta, w)) is not None:
            _float_bias(g, node, b)
    remove_unused_initializers(g)
    g.sort()
