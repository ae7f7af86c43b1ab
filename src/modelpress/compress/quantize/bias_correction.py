"""Bias correction: remove the shift that weight rounding puts into each output channel's mean.

For a layer ``y = W x + b`` quantized to ``Ŵ``, the expected output moves by ``(Ŵ − W) E[x]``
(Nagel et al., "Data-Free Quantization", 2019, section 4.2). ``E[x]``, the mean of each input
channel, is measured on the calibration data by ``ChannelMean``; the correction subtracts the shift
from the bias (creating a zero bias for a Conv that had none). For a convolution the shift sums the
kernel's spatial taps, which is exact away from the zero-padded border.

Activation rounding shifts means too (a channel that sits near one value rounds the same way at
every pixel), and the shift builds up through the layers. That part is measured: the quantized and
the float model run on a few calibration batches, and the difference of the output means of the
last weighted layers (``last_layers``) comes off their biases.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.compress.quantize import pairs
from modelpress.compress.quantize.layers import (
    WEIGHT_INPUT,
    input_channel_axis,
)
from modelpress.compress.quantize.qparams import (
    QParams,
    dequantize,
)
from modelpress.compress.quantize.sensitivity import runner
from modelpress.ir.match import const_array


class ChannelMean:
    """Streaming mean of each channel (``axis``) of the tensors it observes: fixed-size state."""

    def __init__(self, axis: int):
        self.axis = axis
        self.sum: np.ndarray | None = None
        self.count = 0

    def observe(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float64)
        if x.size == 0:
            return
        axis = self.axis % x.ndim
        other = tuple(i for i in range(x.ndim) if i != axis)
        s = x.sum(axis=other)
        self.sum = s if self.sum is None else self.sum + s
        self.count += x.size // x.shape[axis]

    @property
    def mean(self) -> np.ndarray:
        return self.sum / max(self.count, 1)


def input_mean_axis(node: ir.Node) -> int:
    """The axis of the layer's activation input that indexes input channels."""
    return 1 if node.op_type == "Conv" else -1


def output_shift(node: ir.Node, w: np.ndarray, w_hat: np.ndarray, mean_x: np.ndarray) -> np.ndarray:
    """``(Ŵ − W) E[x]`` per output channel."""
    d = (w_hat - w).astype(np.float64)
    if node.op_type == "Conv":
        groups = node.attributes.get_int("group", 1)
        cout, cin_g = d.shape[0], d.shape[1]
        per_tap = d.reshape(cout, cin_g, -1).sum(axis=2)  # (O, C/g): spatial taps summed
        out = np.empty(cout)
        per_group = cout // groups
        for o in range(cout):
            g = o // per_group
            out[o] = per_tap[o] @ mean_x[g * cin_g : (g + 1) * cin_g]
        return out
    k_axis = input_channel_axis(node)
    return np.tensordot(mean_x, d, axes=([0], [k_axis]))


def shifts(
    nodes: list[ir.Node],
    means: dict[str, ChannelMean],
    *,
    per_channel: bool,
    dtype: str = "int8",
    rounded: dict[str, tuple[np.ndarray, QParams]] | None = None,
    pair_safe: bool = False,
) -> dict[str, np.ndarray]:
    """The correction (to subtract from the bias) of every node whose input mean was measured;
    ``rounded``: the codes chosen ahead for some nodes (GPTQ), the others round to nearest (in
    the target's format: ``pair_safe``)."""
    out = {}
    for node in nodes:
        cm = means.get(node.name)
        if cm is None or cm.sum is None:
            continue
        w = const_array(node.inputs[WEIGHT_INPUT[node.op_type]])
        if rounded and node.name in rounded:
            w_hat = dequantize(*rounded[node.name])
        else:
            w_hat = dequantize(
                *pairs.round_weight(
                    node, w, per_channel=per_channel, dtype=dtype, pair_safe=pair_safe
                )
            )
        out[node.name] = output_shift(node, w, w_hat, cm.mean)
    return out


def last_layers(
    model: ir.Model, layers: list[ir.Node], ops: tuple[str, ...] = ("Conv", "Gemm")
) -> list[ir.Node]:
    """The nodes of ``layers`` of type ``ops`` whose output reaches no other weighted op: those
    that write a model's results. (By default not MatMul: for bias correction, a transformer's
    token axis would mix padded positions into the means.)"""
    feeds: set[str] = set()  # tensors from which a weighted op is reachable
    for node in reversed(list(model.graph)):  # consumers before producers
        if node.op_type in WEIGHT_INPUT or any(o.name in feeds for o in node.outputs):
            feeds.update(v.name for v in node.inputs if v is not None)

    return [n for n in layers if n.op_type in ops and n.outputs[0].name not in feeds]


def output_means(
    model: ir.Model, nodes: list[ir.Node], batches: list[dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """The mean of each output channel of ``nodes`` (by name) when ``model`` runs on ``batches``."""

    outs = {n.name: n.outputs[0].name for n in nodes}
    means = {n.name: ChannelMean(1 if n.op_type == "Conv" else -1) for n in nodes}
    run = runner(model, outputs=outs.values(), optimize="disabled")
    for feeds in batches:
        got = run(feeds)
        for name, tensor in outs.items():
            means[name].observe(got[tensor])
    return {k: m.mean for k, m in means.items() if m.sum is not None}


def measured_shifts(
    float_means: dict[str, np.ndarray],
    quantized: ir.Model,
    nodes: list[ir.Node],
    batches: list[dict[str, np.ndarray]],
) -> dict[str, np.ndarray]:
    """What quantization moved each output channel's mean by, everything upstream included:
    the quantized model's means (its weighted layers' float outputs, before they are requantized)
    minus the float model's, on the same data."""
    got = output_means(quantized, nodes, batches)
    return {
        k: got[k] - float_means[k]
        for k in got
        if k in float_means and got[k].shape == float_means[k].shape
    }
