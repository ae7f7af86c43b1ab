"""Weight-only quantization: constant weights stored as integers, activations stay float.

Rule: the weight ``W`` of a MatMul/Gemm/Conv (and the table of a Gather, usually an embedding,
and the input and recurrence weights of an LSTM/GRU/RNN) is replaced by
``DequantizeLinear(W_q, scale, zero_point)``; the op itself is untouched, so the model computes
with ``Ŵ`` in float and stays exactly as portable as before, only smaller.
- ``bits=8``: int8, symmetric, one scale per output channel (per row for Gather tables);
- ``bits=4``: uint4, asymmetric (a scale and a zero point) per block of ``block_size`` consecutive
  elements along the reduction axis (``DequantizeLinear``'s ``block_size``, opset 21; the model is
  upgraded to opset 21 only when it is older, and the result says so). Each block's range is the
  clip, shrunk from min/max, with the least squared error (``method="mse"``). A weight whose
  reduction axis is not a multiple of the block size keeps int8 per-channel form.
- Recurrent weights always get 8 bits (one scale per gate row, shared by the directions): every
  time step reads them again, so their rounding error compounds along the sequence.
- Gather tables stay at 8 bits when ``bits=4`` unless ``tables_bits=4`` is asked for: one
  embedding row feeds a token's whole computation, so its rounding error is not averaged away
  (and a table has no reduction axis for GPTQ to compensate along).
- 4-bit MatMul/Gemm weights are rounded by GPTQ (``gptq.py``) instead of to nearest: each layer's
  ``XᵀX`` on its inputs is gathered in one streaming pass of the float model, and every layer's
  codes are then solved on its own. The inputs are the calibration data, or without any,
  generated inputs (``generated_calibration``; better than rounding to nearest, worse than real
  data). So are 2-D Convs without groups, on their input patches, with the rows reordered so
  that each block (channels at one kernel position) is solved in one piece (``_gptq_conv``).
  Gather tables, grouped Convs and Convs with too long a reduction are rounded to nearest.
ONNX Runtime fuses the 4-bit MatMul form (uint4 codes and zero points) into its ``MatMulNBits``
kernel.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.compress.quantize import gptq as gptq_mod
from modelpress.compress.quantize.calibration import CalibrationSet, collect
from modelpress.compress.quantize.layers import (
    constant,
    gather_tables,
    input_channel_axis,
    output_channel_axis,
    plain_linear,
    weight_nodes,
)
from modelpress.compress.quantize.modes import Built, Mode, Options, Prepared, register
from modelpress.compress.quantize.qdq import dq_constant
from modelpress.compress.quantize.qparams import (
    PerChannel,
    PerGroup,
    QParams,
    dequantize,
    quantize,
    weight_qparams,
)
from modelpress.compress.quantize.sensitivity import runner
from modelpress.errors import InputError, OptionError
from modelpress.ir.graph import copy_model, remove_unused_initializers, swap_node
from modelpress.ir.match import const_array
from modelpress.ir.opset import at_opset
from modelpress.verify.inputs import generate_inputs

BLOCKWISE_OPSET = 21
INT4_TYPE = "uint4"  # asymmetric 4-bit blocks: codes and zero points share DequantizeLinear's type

# A weight's integer codes and their QParams, as ``apply`` stores them.
Quantized = tuple[np.ndarray, QParams]


RECURRENT_OPS = ("LSTM", "GRU", "RNN")


def recurrent_layers(model: ir.Model) -> list[ir.Node]:
    """The LSTM/GRU/RNN nodes whose input (``W``) or recurrence (``R``) weight is a float32
    constant."""
    return [
        n
        for n in model.graph
        if n.op_type in RECURRENT_OPS and n.domain in ("", "ai.onnx") and _weights(n)
    ]


def layers(model: ir.Model) -> list[ir.Node]:
    """The nodes whose constant weight (or table) this mode quantizes."""
    g = model.graph
    return list(weight_nodes(g)) + gather_tables(g) + recurrent_layers(model)


def _weights(node: ir.Node) -> list[tuple[int, int, int]]:
    """(weight input index, output-channel axis, reduction axis) of each weight of a layer. A
    recurrent layer has two, ``W`` and ``R`` (``[directions, gates·hidden, inputs]``): one scale
    per gate row, shared by the directions."""
    if node.op_type == "Gather":
        return [(0, 0, 1)]
    if node.op_type in RECURRENT_OPS:
        return [
            (i, 1, 2)
            for i in (1, 2)
            if len(node.inputs) > i
            and (w := const_array(node.inputs[i])) is not None
            and w.dtype == np.float32
            and w.ndim == 3
        ]
    return [(1, output_channel_axis(node), input_channel_axis(node))]


def blockwise(w: np.ndarray, red_axis: int, bits: int, block_size: int) -> bool:
    """Whether ``w`` gets 4-bit blocks (else int8 per channel)."""
    return bits == 4 and w.shape[red_axis] % block_size == 0


def round_to_nearest(
    w: np.ndarray, out_axis: int, red_axis: int, *, bits: int, block_size: int
) -> Quantized:
    """The codes of ``w`` by this mode's rules, without calibration data (module docstring)."""
    if blockwise(w, red_axis, bits, block_size):
        qp = weight_qparams(
            w, PerGroup(red_axis, block_size), dtype=INT4_TYPE, symmetric=False, method="mse"
        )
    else:
        qp = weight_qparams(w, PerChannel(out_axis), dtype="int8", symmetric=True)
    return quantize(w, qp), qp


def gemms_as_matmuls(model: ir.Model) -> ir.Model:
    """A copy of ``model`` whose plain Gemms with a constant weight are ``MatMul(x, W[K, N])``
    (+ ``Add(bias)``): ONNX Runtime fuses 4-bit blocks into ``MatMulNBits`` only for MatMul weights
    stored ``[K, N]``; a 4-bit Gemm left in the graph (e.g. a torch Linear, ``transB=1``) kept even
    the MatMuls around it unfused (onnxruntime 1.32). Exact: the same products and sums."""
    m = copy_model(model)
    g = m.graph
    for node in list(g):
        if node.op_type != "Gemm" or node.domain not in ("", "ai.onnx") or not plain_linear(node):
            continue
        w = const_array(node.inputs[1])
        if w is None or w.ndim != 2:
            continue
        if node.attributes.get_int("transB", 0):
            w = np.ascontiguousarray(w.T)
        wk = constant(g, w, f"{node.name}_W_kn")
        mm = ir.node("MatMul", [node.inputs[0], wk], name=node.name)
        new = [mm]
        out = mm.outputs[0]
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            add = ir.node("Add", [out, node.inputs[2]], name=f"{node.name}_bias")
            mm.outputs[0].name = f"{node.name}_product"
            new.append(add)
            out = add.outputs[0]
        swap_node(g, node, new, out)
    remove_unused_initializers(g)
    return m


def gptq_layers(model: ir.Model, *, block_size: int) -> list[ir.Node]:
    """The layers GPTQ rounds at 4 bits, with whole blocks: MatMul/Gemm (no transA), and 2-D
    Convs without groups whose input patches are short enough to solve (``gptq.observer``)."""

    out = []
    for node in weight_nodes(model.graph):
        w = const_array(node.inputs[1])
        if not blockwise(w, input_channel_axis(node), 4, block_size):
            continue
        if node.op_type == "Conv":
            if node.attributes.get_int("group", 1) == 1 and gptq_mod.observer(node) is not None:
                out.append(node)
        elif not node.attributes.get_int("transA", 0):
            out.append(node)
    return out


def _patch_order(w: np.ndarray) -> np.ndarray:
    """The permutation of a Conv's input-patch rows (``C·kh·kw``, channel-major, the order of
    its flattened weight and of ``gptq.InputHessian``) that puts each 4-bit block, ``block_size``
    consecutive channels at one kernel position, in consecutive rows: kernel-position-major."""
    c, taps = w.shape[1], int(np.prod(w.shape[2:]))
    return np.arange(c * taps).reshape(c, taps).T.reshape(-1)


def _gptq_conv(w: np.ndarray, h: np.ndarray, block_size: int) -> tuple[Quantized, Quantized]:
    """4-bit GPTQ and round-to-nearest codes of a Conv weight ``[O, C, kh, kw]`` (blocks along
    C), from ``H`` of its input patches: GPTQ runs on the rows in ``_patch_order``, and codes and
    block scales go back to the weight's layout."""
    o, c = w.shape[:2]
    kernel = w.shape[2:]
    order = _patch_order(w)
    wk = w.reshape(o, -1).T[order]  # [taps·C, O]
    codes, qp = gptq_mod.gptq(wk, h[np.ix_(order, order)], block_size=block_size, dtype=INT4_TYPE)
    back = np.empty_like(order)
    back[order] = np.arange(len(order))
    codes = codes[back].T.reshape(w.shape)

    def blocks(a: np.ndarray) -> np.ndarray:  # [taps·C/B, O] → [O, C/B, kh, kw]
        return np.moveaxis(a.reshape(*kernel, c // block_size, o), -1, 0).transpose(0, 3, 1, 2)

    out = (codes, QParams(blocks(qp.scale), blocks(qp.zero_point), qp.dtype, 1, block_size))
    return out, round_to_nearest(w, 0, 1, bits=4, block_size=block_size)


def generated_calibration(model: ir.Model, *, batches: int = 16, dim: int = 16):
    """Stand-in calibration data when none is given: ``batches`` generated input sets (valid token
    ids, standard normal floats; every dynamic dimension ``dim``). Random tokens already show the
    channel structure GPTQ exploits (LayerNorm scales, outlier channels), though real samples
    do better."""

    data = [generate_inputs(model, default_dim=dim, seed=i) for i in range(batches)]
    return CalibrationSet.from_source(data)


def gptq_quantize(
    model: ir.Model, cal, *, block_size: int, skip: frozenset[str] = frozenset(), progress=None
) -> tuple[dict[str, Quantized], list[str]]:
    """GPTQ codes of the 4-bit MatMul/Gemm/Conv weights of ``model`` by node name, and notes.

    One streaming pass of the calibration set (``None``: generated inputs) gathers ``XᵀX`` of each
    distinct layer input (layers that share an input share it; a Conv's, of its input patches);
    the layers are then solved one by one, reporting ``progress(done, total)`` in layers. Left out (rounded to nearest): a layer where
    rounding to nearest has the lower output error on these inputs, one GPTQ cannot solve (a Hessian that is not
    finite or not positive definite), and every layer when generated inputs cannot run the model.
    Layers named in ``skip`` (kept at 8 bits) are not solved.
    """

    nodes = [n for n in gptq_layers(model, block_size=block_size) if n.name not in skip]
    if not nodes:
        return {}, []
    source = "the calibration data"
    linear = {n.inputs[0].name for n in nodes if n.op_type != "Conv"}
    observers = {name: gptq_mod.HessianObserver() for name in linear}
    by_input = {k: [o] for k, o in observers.items()}
    patches = gptq_mod.attach([n for n in nodes if n.op_type == "Conv"], by_input)
    try:
        if cal is None:
            source = "generated inputs (pass calibration data for better accuracy)"
            cal = generated_calibration(model)
        collect(model, cal, by_input, progress=progress)
    except InputError as exc:
        if source == "the calibration data":
            raise
        return {}, [f"4-bit weights rounded to nearest: no generated inputs run the model ({exc})"]
    out: dict[str, Quantized] = {}
    for i, node in enumerate(nodes):
        if progress:
            progress(i, len(nodes))
        w = const_array(node.inputs[1])
        if node.op_type == "Conv":
            h = patches[node.name].hessian(0)
            if not np.isfinite(h).all() or not patches[node.name].rows:
                continue
            try:
                got, rtn = _gptq_conv(w, h, block_size)
            except np.linalg.LinAlgError:
                continue
            wk = w.reshape(len(w), -1).T  # [C·kh·kw, O], the order of h
            flat = [dequantize(*q).reshape(len(w), -1).T for q in (got, rtn)]
            if gptq_mod.output_error(wk, flat[0], h) < gptq_mod.output_error(wk, flat[1], h):
                out[node.name] = got
            continue
        transposed = input_channel_axis(node) == 1  # Gemm transB: W is stored [N, K]
        h = observers[node.inputs[0].name].hessian()
        if not np.isfinite(h).all():
            continue
        wk = w.T if transposed else w
        try:
            codes, qp = gptq_mod.gptq(wk, h, block_size=block_size, dtype=INT4_TYPE)
        except np.linalg.LinAlgError:
            continue
        # GPTQ is greedy: with extreme channel scales its compensation can widen block ranges
        # until it loses to plain rounding, so the layer keeps whichever has less output error.
        rtn = round_to_nearest(wk, 1, 0, bits=4, block_size=block_size)
        if gptq_mod.output_error(wk, dequantize(codes, qp), h) >= gptq_mod.output_error(
            wk, dequantize(*rtn), h
        ):
            continue
        if transposed:
            codes = codes.T
            qp = QParams(qp.scale.T, qp.zero_point.T, qp.dtype, axis=1, block_size=block_size)
        out[node.name] = (codes, qp)
    if progress:
        progress(len(nodes), len(nodes))
    return out, [f"GPTQ: {len(out)} of {len(nodes)} 4-bit weight(s) rounded on {source}"]


def gptq_int8(
    model: ir.Model, cal, *, skip: frozenset[str] = frozenset(), progress=None
) -> tuple[dict[str, Quantized], list[str]]:
    """GPTQ codes of the int8 (per-channel) MatMul/Gemm/Conv weights of ``model`` by node name,
    from one pass over the calibration data, and a note (``gptq.round_layers``: the layers where
    GPTQ lowers the output error; the others round to nearest). Layers in ``skip`` stay float."""

    # a weight read by several nodes (a tied embedding and LM head) is stored once: rounded to
    # nearest, not to fit one reader's inputs
    nodes = [
        n
        for n in weight_nodes(model.graph)
        if n.op_type in ("Conv", "Gemm", "MatMul")
        and len(n.inputs[1].uses()) == 1
        and n.name not in skip
    ]
    by_input: dict[str, list] = {}
    hessians = gptq_mod.attach(nodes, by_input)
    if not hessians:
        return {}, []
    collect(model, cal, by_input, progress=progress)
    out = gptq_mod.round_layers(nodes, hessians, per_channel=True, progress=progress)
    return out, [gptq_mod.note(len(out), len(nodes))]


def local_errors(
    model: ir.Model,
    nodes: list[ir.Node],
    inputs: dict[str, np.ndarray],
    *,
    bits: int,
    block_size: int,
    quantized: dict[str, Quantized] | None = None,
) -> dict[str, float]:
    """How much each layer's own output changes when its weight is quantized: ``‖x(W − Ŵ)‖ / ‖xW‖``
    on the layer's real input for MatMul/Gemm, ``‖W − Ŵ‖ / ‖W‖`` for convolutions, tables and
    recurrent weights. One forward pass ranks every layer (the accuracy budget's order).
    ``quantized`` holds codes already computed (GPTQ's); the others are rounded to nearest."""
    out = {}
    for node in nodes:
        if node.op_type in RECURRENT_OPS:  # W and R together, at 8 bits whatever ``bits``
            ws = [const_array(node.inputs[i]) for i, _, _ in _weights(node)]
            ds = [dequantize(*round_to_nearest(w, 1, 2, bits=8, block_size=0)) - w for w in ws]
            err = np.sqrt(sum(float(np.sum(d**2)) for d in ds))
            out[node.name] = err / max(np.sqrt(sum(float(np.sum(w**2)) for w in ws)), 1e-30)
            continue
        ((idx, out_axis, red),) = _weights(node)
        w = const_array(node.inputs[idx])
        got = (quantized or {}).get(node.name)
        if got is None:
            got = round_to_nearest(w, out_axis, red, bits=bits, block_size=block_size)
        d = dequantize(*got) - w
        x = inputs.get(node.inputs[0].name)
        if node.op_type in ("MatMul", "Gemm") and x is not None:
            x2 = x.reshape(-1, x.shape[-1]).astype(np.float32)
            wk = w.T if red == 1 else w
            dk = d.T if red == 1 else d
            out[node.name] = float(np.linalg.norm(x2 @ dk) / max(np.linalg.norm(x2 @ wk), 1e-30))
        else:
            out[node.name] = float(np.linalg.norm(d) / max(np.linalg.norm(w), 1e-30))
    return out


def _stored(codes: np.ndarray, qp: QParams) -> tuple[np.ndarray, QParams]:
    """4-bit codes and zero points in their packed ml_dtypes type, as the graph stores them."""
    if qp.dtype not in ("int4", "uint4"):
        return codes, qp
    import ml_dtypes

    t = getattr(ml_dtypes, qp.dtype)
    zp = qp.zero_point.astype(t)
    return codes.astype(t), QParams(qp.scale, zp, qp.dtype, axis=qp.axis, block_size=qp.block_size)


def apply(
    model: ir.Model,
    *,
    bits: int = 8,
    block_size: int = 32,
    exclude: frozenset[str] = frozenset(),
    tables_bits: int | None = None,
    int8_layers: frozenset[str] = frozenset(),
    quantized: dict[str, Quantized] | None = None,
) -> tuple[ir.Model, list[str], list[str]]:
    """A weight-only quantized copy of ``model``, the nodes quantized, and notes for the user.

    ``tables_bits`` sets the bits of Gather tables (default 8); nodes named in ``int8_layers`` keep
    8 bits when ``bits=4`` (the accuracy budget's fallback). ``quantized`` holds codes already
    computed for some nodes (``gptq_quantize``, ``gptq_int8``), used where their bits are the
    node's; the other weights are rounded to nearest.
    """
    if bits not in (4, 8):
        raise OptionError(f"`bits` {bits}: weight-only quantization supports 8 or 4 bits")
    if tables_bits not in (None, 4, 8):
        raise OptionError(f"tables_bits {tables_bits}: use 8 or 4")
    if bits == 4 and (block_size < 16 or block_size & (block_size - 1)):
        raise OptionError(f"`block_size` {block_size}: use a power of two of at least 16")
    tables_bits = tables_bits or 8
    quantized = quantized or {}
    notes: list[str] = []
    m = copy_model(model)
    if 4 in (bits, tables_bits):
        m, notes = at_opset(m, BLOCKWISE_OPSET, "4-bit blocks (DequantizeLinear's block_size)")
    g = m.graph
    done = []
    fallback = 0
    targets = [(n, 8 if n.name in int8_layers else bits) for n in weight_nodes(g)]
    targets += [(n, tables_bits) for n in gather_tables(g)]
    # (recurrent weights at 8 bits: each step reads them again, so rounding errors compound)
    targets += [(n, 8) for n in recurrent_layers(m)]
    cache: dict[int, ir.Value] = {}  # a table shared by several nodes is quantized once
    for node, nbits in targets:
        if node.name in exclude:
            continue
        for idx, out_axis, red_axis in _weights(node):
            v = node.inputs[idx]
            if id(v) in cache:
                node.replace_input_with(idx, cache[id(v)])
                continue
            w = const_array(v)
            fallback += nbits == 4 and not blockwise(w, red_axis, 4, block_size)
            got = quantized.get(node.name)
            if got is not None and (got[1].dtype == "int8") == (nbits == 8):
                q, qp = got
            else:
                q, qp = round_to_nearest(w, out_axis, red_axis, bits=nbits, block_size=block_size)
            dq = dq_constant(g, *_stored(q, qp), v.name or f"{node.name}_W")
            cache[id(v)] = dq
            node.replace_input_with(idx, dq)
        done.append(node.name)
    if fallback:
        notes.append(
            f"{fallback} weight(s) kept int8 per-channel: reduction axis not a multiple of {block_size}"
        )
    remove_unused_initializers(g)
    g.sort()
    return m, done, notes


@register
class WeightOnlyMode(Mode):
    name = "weight-only"
    order = 2
    help = "int8 or 4-bit weights, float activations (memory-bound models, LLMs)"
    nothing_to_quantize = "it quantizes the constant weights of MatMul, Gemm and Conv"

    def int8_layers(self, model, options: Options) -> bool:
        return options.bits == 8 and bool(layers(model))

    def prepare(self, model, cal, opt: Options, progress) -> Prepared:
        if opt.bits == 4:
            model = gemms_as_matmuls(model)
        nodes = layers(model)
        solved, notes = {}, []
        if opt.bits == 4 and opt.gptq:  # error-compensating rounding, on generated inputs if no cal
            solved, notes = gptq_quantize(
                model, cal, block_size=opt.block_size, skip=opt.exclude, progress=progress
            )
        elif opt.gptq and cal is not None:
            solved, notes = gptq_int8(model, cal, skip=opt.exclude, progress=progress)
        if opt.bits == 4:  # 4-bit blocks that GPTQ did not solve, where CNNs lose the most
            convs = [
                n
                for n in nodes
                if n.op_type == "Conv"
                and n.name not in opt.exclude
                and n.name not in solved
                and blockwise(const_array(n.inputs[1]), 1, 4, opt.block_size)
            ]
            if convs:
                notes.append(
                    f"{len(convs)} Conv weight(s) at 4 bits rounded to nearest (grouped, too wide "
                    "for GPTQ, better rounded, or GPTQ off): CNNs lose the most accuracy here; "
                    "an accuracy budget or excluded layers keep Convs at 8 bits"
                )

        def build(exclude):
            # With 4 bits, the budget's fallback for a sensitive layer is 8 bits, not float.
            if opt.bits == 4:
                q, done, built_notes = apply(
                    model, bits=4, block_size=opt.block_size, int8_layers=exclude, quantized=solved
                )
            else:
                q, done, built_notes = apply(
                    model,
                    bits=opt.bits,
                    block_size=opt.block_size,
                    exclude=exclude,
                    quantized=solved,
                )
            # (4 bits wrote Gemms as MatMul + Add first: the report compares against that model)
            return Built.at_outputs(model, q, done, built_notes)

        def rank(batches):
            wanted = {n.inputs[0].name for n in nodes if n.op_type in ("MatMul", "Gemm")}
            run = runner(model, outputs=wanted, optimize="disabled")
            scores = dict.fromkeys((n.name for n in nodes), 0.0)
            for feeds in batches:
                got = run(feeds)
                local = local_errors(
                    model, nodes, got, bits=opt.bits, block_size=opt.block_size, quantized=solved
                )
                for k, v in local.items():
                    scores[k] += v
            if (
                opt.bits == 4
            ):  # a recurrent layer is at 8 bits already: keeping it so changes nothing
                scores.update(dict.fromkeys((n.name for n in recurrent_layers(model)), 0.0))
            return scores

        return Prepared(build, [n.name for n in nodes], notes, rank)
