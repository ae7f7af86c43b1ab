"""Outlier smoothing (SmoothQuant): move activation outliers into the weights before int8.

Transformer activations have a few channels far larger than the rest; one int8 scale for the whole
tensor then leaves the other channels a handful of levels. For ``y = x·W`` the same ``y`` is
computed by ``(x / s)·(diag(s)·W)``: dividing channel ``k`` of the activation by ``s_k`` and
multiplying row ``k`` of the weight by it moves the range into the weights, which have one scale
per output column. Used by dynamic and static int8 (the ``Mul`` stays float, before the quantized
op), chosen per input on calibration rows sampled with bounded memory.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.compress.quantize import calibration
from modelpress.compress.quantize.layers import constant, plain_linear, weight_nodes
from modelpress.compress.quantize.qparams import (
    PerChannel,
    PerTensor,
    fake_quantize,
    qparams_from_range,
    weight_qparams,
)
from modelpress.ir.graph import copy_model, remove_unused_initializers
from modelpress.ir.match import const_array


def attention_like(model: ir.Model) -> bool:
    """Whether ``model`` has attention's outlier channels to smooth (a Softmax or a LayerNorm):
    a CNN's layers have none, and lose accuracy to smoothing."""
    return any(n.op_type in ("Softmax", "LayerNormalization") for n in model.graph)


def kn_weight(node: ir.Node) -> np.ndarray:
    """The weight of a MatMul/Gemm as ``[K, N]`` (``y = x·W``), whatever Gemm's ``transB``."""
    w = const_array(node.inputs[1])
    if node.op_type == "Gemm" and node.attributes.get_int("transB", 0):
        w = w.T
    return np.ascontiguousarray(w, dtype=np.float32)


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
    w_max = np.max([np.abs(kn_weight(n)).max(axis=1) for n in users], axis=0)
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
        w = kn_weight(n)
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
        refs = [x @ kn_weight(n) for n in users]
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


def smooth(model: ir.Model, factors: dict[str, np.ndarray]) -> ir.Model:
    """A copy of ``model`` computing the same function with its activation outliers moved into the
    weights: each input named in ``factors`` is divided by ``s`` (one ``Mul``, shared by all its
    readers) and the weight rows of every MatMul/Gemm reading it are multiplied by ``s``."""
    m = copy_model(model)
    g = m.graph
    smoothed: dict[str, ir.Value] = {}
    for node in [n for n in weight_nodes(g) if plain_linear(n) and n.op_type != "Conv"]:
        x = node.inputs[0]
        if x is None or x.name not in factors:
            continue
        s = factors[x.name]
        if x.name not in smoothed:
            inv = constant(g, (1.0 / s).astype(np.float32), f"{x.name}_smooth")
            mul = ir.node("Mul", [x, inv], name=f"{x.name}_Smooth")
            mul.outputs[0].name = f"{x.name}_smoothed"
            mul.outputs[0].type, mul.outputs[0].shape = x.type, x.shape
            if x.producer() is not None:
                g.insert_after(x.producer(), mul)
            else:
                g.insert_before(next(iter(g)), mul)
            smoothed[x.name] = mul.outputs[0]
        w = const_array(node.inputs[1])
        transposed = node.op_type == "Gemm" and node.attributes.get_int("transB", 0)
        scaled = w * (s[None, :] if transposed else s[:, None])
        node.replace_input_with(
            1, constant(g, scaled.astype(np.float32), f"{node.name}_W_smoothed")
        )
        node.replace_input_with(0, smoothed[x.name])
    remove_unused_initializers(g)
    return m


def calibrate(model: ir.Model, nodes: list[ir.Node], cal, *, per_channel: bool, progress=None):
    """Sample the inputs of ``nodes`` on the calibration data and choose their factors."""
    samples = {i: RowSample() for i in sorted({n.inputs[0].name for n in nodes})}
    calibration.collect(model, cal, {i: [s] for i, s in samples.items()}, progress=progress)
    return smoothing_factors(nodes, samples, per_channel=per_channel), len(samples)
