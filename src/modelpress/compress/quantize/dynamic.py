"""Dynamic int8 quantization: weights quantized ahead of time, activations at run time.

Rule: every MatMul/Gemm with a constant 2-D weight becomes, in standard ONNX ops,
``DynamicQuantizeLinear(x) → MatMulInteger(x_q, W_q, x_zp, W_zp) → Cast → Mul(x_scale · W_scale)
[→ Add(bias)]``, with int8 symmetric weights (per output column when ``per_channel``) and uint8
activations whose scale is computed per batch. ONNX Runtime fuses exactly this chain into one
``DynamicQuantizeMatMul`` kernel (u8s8, VNNI on x86), so the output is standard ONNX and runs fast
there. Large embedding tables become int8 rows with one scale each, converted back only for the
rows a Gather looks up. Convolutions stay float: ``ConvInteger`` has no fast kernel in ONNX Runtime. Legal for any
graph: each rewritten node keeps its output value, so consumers are untouched.

With calibration data, activation outliers are first moved into the weights (``smoothing_factors``).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.compress.quantize._graph import (
    const_array,
    constant,
    copy_model,
    plain_linear,
    remove_unused_initializers,
    replace_value,
    weight_nodes,
)
from modelpress.compress.quantize.qparams import (
    PerChannel,
    PerTensor,
    fake_quantize,
    qparams_from_range,
    quantize,
    weight_qparams,
)


def eligible(node: ir.Node) -> bool:
    if node.op_type == "Conv":
        return False
    return plain_linear(node)


def layers(model: ir.Model, exclude: frozenset[str] = frozenset()) -> list[ir.Node]:
    return [n for n in weight_nodes(model.graph) if eligible(n) and n.name not in exclude]


def _kn_weight(node: ir.Node) -> np.ndarray:
    w = const_array(node.inputs[1])
    if node.op_type == "Gemm" and node.attributes.get_int("transB", 0):
        w = w.T
    return np.ascontiguousarray(w, dtype=np.float32)  # [K, N]


class RowSample:
    """A fixed-size uniform sample of the rows (last axis = channels) of the tensors it observes
    (reservoir sampling: memory does not grow with the calibration set)."""

    def __init__(self, size: int = 256, seed: int = 0):
        self.size = size
        self.rows: np.ndarray | None = None
        self.seen = 0
        self.rng = np.random.default_rng(seed)

    def observe(self, x: np.ndarray) -> None:
        rows = np.asarray(x, dtype=np.float32).reshape(-1, np.shape(x)[-1])
        if self.rows is None:
            self.rows = rows[: self.size].copy()
            self.seen = len(self.rows)
            rows = rows[len(self.rows) :]
        elif len(self.rows) < self.size:
            take = rows[: self.size - len(self.rows)]
            self.rows = np.vstack([self.rows, take])
            self.seen += len(take)
            rows = rows[len(take) :]
        if len(rows):
            # row i of this batch replaces a random slot with probability size / (rows seen so far)
            seen = self.seen + np.arange(1, len(rows) + 1)
            j = (self.rng.random(len(rows)) * seen).astype(np.int64)
            hit = j < self.size
            self.rows[j[hit]] = rows[
                hit
            ]  # later rows win on repeated slots, as in sequential order
            self.seen += len(rows)


def _factors(users: list[ir.Node], x_max: np.ndarray, alpha: float) -> np.ndarray:
    w_max = np.max([np.abs(_kn_weight(n)).max(axis=1) for n in users], axis=0)
    s = np.maximum(x_max, 1e-5) ** alpha / np.maximum(w_max, 1e-5) ** (1 - alpha)
    # Only shrink channels above the typical one: amplifying a channel that was quiet during
    # calibration would blow up the range the day it is not (a common scale factor changes nothing).
    return np.clip(s / np.median(s), 1.0, 1e2).astype(np.float32)


def _matmul_error(
    x: np.ndarray,
    users: list[ir.Node],
    s: np.ndarray | None,
    per_channel: bool,
    refs: list[np.ndarray],
) -> float:
    """Squared error of the users' outputs on the sampled rows, quantized as at run time."""
    xs = x if s is None else x / s
    xqp = qparams_from_range(xs.min(), xs.max(), dtype="uint8")
    xd = fake_quantize(xs, xqp)
    err = 0.0
    for n, ref in zip(users, refs, strict=True):
        w = _kn_weight(n)
        ws = w if s is None else w * s[:, None]
        wd = fake_quantize(
            ws, weight_qparams(ws, PerChannel(1) if per_channel else PerTensor(), dtype="int8")
        )
        err += float(np.sum((xd @ wd - ref) ** 2))
    return err


ALPHAS = (0.5, 0.7, 0.85)


def smoothing_factors(
    nodes: list[ir.Node], samples: dict[str, RowSample], *, per_channel: bool = True
) -> dict[str, np.ndarray]:
    """Per input channel ``s_k = max|x_k|^α / max|W_k|^(1−α)`` for each shared activation input.

    Dividing the activation by ``s`` and multiplying the weight rows by it leaves the product
    unchanged while moving outlier channels' range from the activation (one scale for the whole
    tensor at run time) into the weights (one scale per output column), as SmoothQuant does.
    ``α`` is chosen per input among ``ALPHAS`` by the error on the sampled calibration rows, and
    an input is left alone when no ``α`` cuts the error of no smoothing by at least 10%.
    """
    by_input: dict[str, list[ir.Node]] = {}
    for n in nodes:
        if n.inputs[0].name in samples and samples[n.inputs[0].name].rows is not None:
            by_input.setdefault(n.inputs[0].name, []).append(n)
    out = {}
    for name, users in by_input.items():
        x = samples[name].rows
        x_max = np.abs(x).max(axis=0)
        refs = [x @ _kn_weight(n) for n in users]
        best, best_err = None, _matmul_error(x, users, None, per_channel, refs)
        for alpha in ALPHAS:
            s = _factors(users, x_max, alpha)
            e = _matmul_error(x, users, s, per_channel, refs)
            # the Mul that smoothing adds costs time at every run: demand a clear gain
            if e < best_err * (0.9 if best is None else 1.0):
                best, best_err = s, e
        if best is not None:
            out[name] = best
    return out


def _gather_tables(graph: ir.Graph) -> list[ir.Node]:
    out = []
    for node in graph:
        if (
            node.op_type == "Gather"
            and node.domain in ("", "ai.onnx")
            and node.attributes.get_int("axis", 0) == 0
        ):
            t = const_array(node.inputs[0])
            if t is not None and t.dtype == np.float32 and t.ndim == 2 and t.size >= TABLE_MIN_SIZE:
                out.append(node)
    return out


# Tables smaller than this stay float: the saving is not worth two extra nodes.
TABLE_MIN_SIZE = 1 << 16


def _quantize_table(g: ir.Graph, node: ir.Node, cache: dict) -> None:
    """``Gather(T, ids)`` → ``Cast(Gather(T_q, ids)) · Unsqueeze(Gather(scale, ids), -1)``:
    int8 rows, one scale per row, and only the rows looked up are converted at run time."""
    table = node.inputs[0]
    if id(table) not in cache:
        t = const_array(table)
        qp = weight_qparams(t, PerChannel(0), dtype="int8", symmetric=True)
        cache[id(table)] = (
            constant(g, quantize(t, qp), f"{table.name}_quantized"),
            constant(g, qp.scale.astype(np.float32), f"{table.name}_row_scale"),
        )
    tq, scale = cache[id(table)]
    ids = node.inputs[1]
    base = node.name
    rows = ir.node("Gather", [tq, ids], attributes={"axis": 0}, name=f"{base}_rows")
    cast = ir.node(
        "Cast", [rows.outputs[0]], attributes={"to": ir.DataType.FLOAT}, name=f"{base}_Cast"
    )
    sc = ir.node("Gather", [scale, ids], attributes={"axis": 0}, name=f"{base}_scales")
    axes = constant(g, np.array([-1], np.int64), f"{base}_axes")
    unsq = ir.node("Unsqueeze", [sc.outputs[0], axes], name=f"{base}_Unsqueeze")
    out = ir.node("Mul", [cast.outputs[0], unsq.outputs[0]], name=f"{base}_dequantize")
    for n in (rows, cast, sc, unsq):
        n.outputs[0].name = f"{n.name}_output"
    g.insert_after(node, [rows, cast, sc, unsq, out])
    old = node.outputs[0]
    out.outputs[0].type, out.outputs[0].shape = old.type, old.shape
    name = old.name
    replace_value(old, out.outputs[0])
    g.remove(node, safe=True)
    out.outputs[0].name = name


def apply(
    model: ir.Model,
    *,
    per_channel: bool = True,
    exclude: frozenset[str] = frozenset(),
    smoothing: dict[str, np.ndarray] | None = None,
    quantize_tables: bool = True,
) -> tuple[ir.Model, list[str]]:
    """A dynamically quantized copy of ``model`` and the names of the nodes it quantized.

    ``smoothing`` (from ``smoothing_factors``) maps activation inputs to per-channel factors;
    ``quantize_tables`` stores large Gather tables (embeddings) as int8 rows.
    """
    m = copy_model(model)
    g = m.graph
    done = []
    smoothed: dict[str, ir.Value] = {}
    for node in layers(m, exclude):
        w = _kn_weight(node)
        x = node.inputs[0]
        if smoothing and x.name in smoothing:
            s = smoothing[x.name]
            w = w * s[:, None]
            if x.name not in smoothed:
                inv = constant(g, (1.0 / s).astype(np.float32), f"{x.name}_smooth")
                mul = ir.node("Mul", [x, inv], name=f"{x.name}_Smooth")
                mul.outputs[0].name = f"{x.name}_smoothed"
                g.insert_after(x.producer(), mul) if x.producer() is not None else g.insert_before(
                    next(iter(g)), mul
                )
                smoothed[x.name] = mul.outputs[0]
            node.replace_input_with(0, smoothed[x.name])
        qp = weight_qparams(
            w, PerChannel(1) if per_channel else PerTensor(), dtype="int8", symmetric=True
        )
        wq = quantize(w, qp)
        base = node.name
        dql = ir.node(
            "DynamicQuantizeLinear", [node.inputs[0]], num_outputs=3, name=f"{base}_DynamicQuantize"
        )
        xq, xs, xzp = dql.outputs
        for v, suffix in zip(dql.outputs, ("quantized", "scale", "zero_point"), strict=True):
            v.name = f"{base}_input_{suffix}"
        w_val = constant(g, wq, f"{base}_W_quantized")
        wzp = constant(
            g,
            np.zeros(qp.scale.shape, np.int8) if per_channel else np.int8(0),
            f"{base}_W_zero_point",
        )
        mmi = ir.node("MatMulInteger", [xq, w_val, xzp, wzp], name=f"{base}_MatMulInteger")
        cast = ir.node(
            "Cast", [mmi.outputs[0]], attributes={"to": ir.DataType.FLOAT}, name=f"{base}_Cast"
        )
        ws = constant(g, qp.scale.astype(np.float32), f"{base}_W_scale")
        scale = ir.node("Mul", [xs, ws], name=f"{base}_scale")
        out = ir.node("Mul", [cast.outputs[0], scale.outputs[0]], name=f"{base}_rescale")
        new_nodes = [dql, mmi, cast, scale, out]
        result = out.outputs[0]
        if node.op_type == "Gemm" and len(node.inputs) > 2 and node.inputs[2] is not None:
            add = ir.node("Add", [result, node.inputs[2]], name=f"{base}_bias")
            new_nodes.append(add)
            result = add.outputs[0]
        for v in new_nodes[1:]:
            v.outputs[0].name = v.outputs[0].name or f"{v.name}_output"
        g.insert_after(node, new_nodes)
        old = node.outputs[0]
        result.type, result.shape = old.type, old.shape
        name = old.name
        replace_value(old, result)
        g.remove(node, safe=True)
        result.name = (
            name  # the layer's output keeps its name (reports match float and int8 tensors)
        )
        done.append(node.name)
    if quantize_tables:
        cache: dict = {}
        for node in _gather_tables(g):
            if node.name not in exclude:
                _quantize_table(g, node, cache)
    remove_unused_initializers(g)
    g.sort()
    return m, done
