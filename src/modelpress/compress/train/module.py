"""ONNX models as modules to train, and trained modules back to ONNX.

``trainable(model, features=...)`` builds the PyTorch backend's module for ``model`` with the named
intermediate values added as extra outputs (for feature matching), in training mode; ``teacher``
builds the same, frozen. ``export(module, model)`` is ``model`` with every initializer replaced by the
module's current value (parametrized weights as they compute: masked, shared or fake-quantized), the
extra outputs dropped again. The graph itself never changes in training.
"""

from __future__ import annotations

import onnx_ir as ir
from torch import nn

from modelpress.errors import InputError
from modelpress.ir.graph import copy_model
from modelpress.ir.match import values_by_name
from modelpress.runtime.torch_backend import to_onnx, to_torch


def _with_outputs(model: ir.Model, features: list[str]) -> ir.Model:
    if not features:
        return model
    m = copy_model(model)
    values = values_by_name(m.graph)
    for name in features:
        if name not in values:
            raise InputError(f"feature {name!r} is not a value of the model")
        # appended even when it is already an output: the module returns features by position
        m.graph.outputs.append(values[name])
    return m


def trainable(
    model: ir.Model,
    *,
    features: list[str] | None = None,
    device=None,
    batch_statistics: bool = True,
) -> nn.Module:
    """A trainable module computing ``model``'s outputs, then the values named in ``features``.

    ``batch_statistics``: in training mode, BatchNormalization normalizes with the batch's own
    statistics and updates its running ones (momentum 0.1), as a PyTorch model fine-tunes; in
    evaluation mode (and in the exported model) it uses the running statistics. Without it, the
    backend's inference semantics hold throughout (statistics frozen).
    """

    module = to_torch(_with_outputs(model, list(features or [])), device=device)
    if batch_statistics:
        for step in module.program.steps:
            if step.ctx.op_type == "BatchNormalization" and step.ctx.num_outputs == 1:
                step.fn = _batch_norm(module, step.fn)
    module.train()
    return module


def _batch_norm(module: nn.Module, inference):
    """A BatchNormalization kernel that follows ``module.training``."""
    import torch.nn.functional as F

    def kernel(ctx, x, scale, bias, mean, var):
        if not module.training or ctx.attr("training_mode", 0):
            return inference(ctx, x, scale, bias, mean, var)
        # F.batch_norm updates mean and var in place: they are the module's buffers, so the
        # exported model carries the statistics of the data it was tuned on
        return F.batch_norm(x, mean, var, scale, bias, True, 0.1, ctx.attr("epsilon", 1e-5))

    return kernel


def teacher(model: ir.Model, *, features: list[str] | None = None, device=None) -> nn.Module:
    """``trainable`` frozen: evaluation mode, no gradients."""
    module = trainable(model, features=features, device=device).eval()
    for p in module.parameters():
        p.requires_grad_(False)
    return module


def export(module: nn.Module, model: ir.Model) -> ir.Model:
    """``model`` with the module's current weights (its extra outputs removed)."""

    out = to_onnx(module)
    keep = len(model.graph.outputs)
    while len(out.graph.outputs) > keep:
        out.graph.outputs.pop()
    return out
