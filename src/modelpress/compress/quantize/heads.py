"""The classifier-head policy: a small head that 8-bit inputs would disturb stays float.

Candidates (``head_candidates``) are Gemms and MatMuls on pooled features that write the outputs
and are a negligible part of the work and of the weights. ``head_input_errors`` measures, on the
calibration data, how far rounding the head's input to 8 bits moves its outputs relative to their
spread across samples; above ``HEAD_TOLERANCE`` the head stays float: nothing after it averages
that rounding out.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.compress.quantize.bias_correction import last_layers
from modelpress.compress.quantize.layers import (
    WEIGHT_INPUT,
)
from modelpress.compress.quantize.ops import eligible, reduction_size
from modelpress.compress.quantize.qparams import (
    QParams,
    fake_quantize,
)
from modelpress.compress.quantize.sensitivity import runner
from modelpress.compress.quantize.smoothing import kn_weight
from modelpress.ir.match import const_array

# A head whose outputs 8-bit inputs move by more than this share of their spread stays float.
HEAD_TOLERANCE = 0.02
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
    return int(np.prod([d if isinstance(d, int) else 1 for d in shape])) * reduction_size(node)


def head_candidates(model: ir.Model) -> list[str]:
    """The classifier heads that may stay float: Gemms and MatMuls on a 2-D input (pooled
    features) whose output reaches no other weighted op, that cost at most ``HEAD_MAX_SHARE`` of
    the model's multiply-adds and hold at most ``HEAD_MAX_WEIGHTS`` of its weights (an ImageNet
    head on a small backbone does not qualify). Which of them
    do is measured on the calibration data (``head_input_errors``, in static mode)."""

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
