"""Fake quantization on the QDQ graph static mode writes, trained, and written back into it.

``TrainingGraph(qdq)`` turns static mode's QDQ model into a trainable one with the same Q/DQ
pairs: each weight ``DequantizeLinear(int8 codes)`` becomes ``DequantizeLinear(QuantizeLinear(W))``
of a float weight ``W`` (its dequantized value), each int32 bias a float bias (rounded on the
int32 grid ``scale_x · scale_w`` in the forward pass, as it will be exported). ``module()`` builds
the PyTorch backend's module for it and swaps the QuantizeLinear/DequantizeLinear kernels for
fake-quantization ones: ``q = clamp(round(x / s) + z)`` kept in float, rounding with a straight-
through gradient, so gradients reach the weights and, through ``x / s``, the scales (learned step
size, Esser et al. 2020); zero points stay fixed. ``export(module)`` writes the trained weights as
codes on the trained scales, the activation scales, and the int32 biases on ``scale_x · scale_w``
into a copy of the QDQ model: the graph is the one static mode wrote, only its constants change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
import torch
from torch import nn

from modelpress.compress.quantize import pairs
from modelpress.ir.graph import add_initializer, copy_model
from modelpress.ir.match import const_array
from modelpress.runtime.torch_backend import to_torch

_RANGE = {torch.uint8: (0, 255), torch.int8: (-128, 127), torch.int32: (-(2**31), 2**31 - 1)}


def _along(p: torch.Tensor, x: torch.Tensor, axis: int) -> torch.Tensor:
    if p.numel() == 1:
        return p.reshape(())
    shape = [1] * x.dim()
    shape[axis % x.dim()] = -1
    return p.reshape(shape)


def _fake_quantize(ctx, x, scale, zero_point=None):
    axis = ctx.attr("axis", 1)
    lo, hi = _RANGE.get(zero_point.dtype if zero_point is not None else torch.uint8, (0, 255))
    bound = getattr(ctx, "qat_bound", None)
    if bound is not None:
        lo, hi = max(lo, -bound), min(hi, bound - 1)
    s = _along(scale.abs().clamp_min(1e-12), x, axis)
    z = _along(zero_point.float(), x, axis) if zero_point is not None else 0.0
    v = x / s
    rounded = v + (torch.round(v) - v).detach()  # straight-through rounding
    return torch.clamp(rounded + z, lo, hi)


def _fake_dequantize(ctx, q, scale, zero_point=None):
    axis = ctx.attr("axis", 1)
    s = _along(scale.abs().clamp_min(1e-12), q, axis)
    z = _along(zero_point.float(), q, axis) if zero_point is not None else 0.0
    return (q - z) * s


@dataclass
class TrainingGraph:
    qdq: ir.Model
    bits: int = 8  # weight bits: 8, or 4 (codes in [-8, 7] in int8 containers)
    model: ir.Model = field(init=False)
    weights: dict[str, tuple[str, str]] = field(default_factory=dict)  # weight DQ → (W, consumer)
    biases: dict[str, tuple[str, str]] = field(default_factory=dict)  # bias DQ → (b, consumer)
    scales: set[str] = field(default_factory=set)

    def __post_init__(self):
        self.model = copy_model(self.qdq)
        g = self.model.graph
        for node in list(g):
            if node.op_type == "QuantizeLinear":
                self.scales.add(node.inputs[1].name)
            if node.op_type != "DequantizeLinear":
                continue
            codes = const_array(node.inputs[0])
            if codes is None:
                continue
            scale = const_array(node.inputs[1])
            zp = (
                const_array(node.inputs[2])
                if len(node.inputs) > 2 and node.inputs[2] is not None
                else np.zeros((), codes.dtype)
            )
            axis = node.attributes["axis"].value if "axis" in node.attributes else 1
            value = (
                (codes.astype(np.float64) - _bcast(zp, codes, axis)) * _bcast(scale, codes, axis)
            ).astype(np.float32)
            users = [u.node for u in node.outputs[0].uses()]
            consumer = users[0].name if users else ""
            if codes.dtype == np.int32:
                b = add_initializer(g, value, f"{node.name}_float")
                for use in list(node.outputs[0].uses()):
                    use.node.replace_input_with(use.idx, b)
                self.biases[node.name] = (b.name, consumer)
                continue
            if self.bits == 4:
                # 16 levels: the scale spans the weight's range on [-7, 7] (per channel when the
                # int8 scale was), so that rounding to nearest is the starting point, not clipping
                reduce = tuple(
                    i for i in range(value.ndim) if scale.size == 1 or i != axis % value.ndim
                )
                s4 = np.maximum(np.abs(value).max(axis=reduce, keepdims=False) / 7.0, 1e-12)
                node.inputs[1].const_value = ir.tensor(
                    s4.astype(scale.dtype).reshape(scale.shape), name=node.inputs[1].name
                )
            w = add_initializer(g, value, f"{node.name}_float")
            q = ir.node(
                "QuantizeLinear",
                [w, node.inputs[1], node.inputs[2]],
                attributes={"axis": axis} if scale.size > 1 else {},
                name=f"{node.name}_fakeQ",
            )
            g.insert_before(node, q)
            q.outputs[0].type = node.inputs[0].type
            node.replace_input_with(0, q.outputs[0])
            self.weights[node.name] = (w.name, consumer)
            self.scales.add(node.inputs[1].name)
        for node in reversed(list(g)):
            if (
                node.op_type == "DequantizeLinear"
                and not node.outputs[0].uses()
                and not node.outputs[0].is_graph_output()
            ):
                g.remove(node, safe=True)

    def module(self) -> nn.Module:
        """The fake-quantized trainable module (weights and scales are parameters)."""

        module = to_torch(self.model)
        weight_q = {f"{dq}_fakeQ" for dq in self.weights}
        for step in module.program.steps:
            if step.ctx.op_type == "QuantizeLinear":
                step.fn = _fake_quantize
                if self.bits == 4 and step.ctx.name in weight_q:
                    step.ctx.qat_bound = 8
            elif step.ctx.op_type == "DequantizeLinear":
                step.fn = _fake_dequantize
        for name in sorted(self.scales):
            attr = module.onnx_names.get(name)
            if attr is not None and attr in module._buffers:
                tensor = module._buffers.pop(attr)
                module.register_parameter(attr, nn.Parameter(tensor.float()))
        self._round_biases(module)
        module.train()
        return module

    def _round_biases(self, module: nn.Module) -> None:
        """Each bias that ``export`` writes as int32 codes on ``scale_x · scale_w`` is rounded on
        that grid in the forward pass too (straight through), so that training sees the biases
        the exported model will run: a bias off its grid by half a step moves an output that
        sits on a rounding boundary of the next QuantizeLinear by a whole step."""
        by = {n.name: n for n in self.model.graph}
        consumers = {consumer for _, consumer in self.weights.values()}
        bias_of = {consumer: b for b, consumer in self.biases.values()}
        for step in module.program.steps:
            node = by.get(step.ctx.name)
            if (
                node is None
                or node.name not in bias_of
                or node.name not in consumers
                or len(step.inputs) != 3
            ):
                continue
            x_dq, w_dq = (v.producer() for v in node.inputs[:2])
            if (
                x_dq is None
                or x_dq.op_type != "DequantizeLinear"
                or w_dq is None
                or w_dq.op_type != "DequantizeLinear"
            ):
                continue
            step.inputs = [*step.inputs, x_dq.inputs[1].name, w_dq.inputs[1].name]
            step.fn = _with_int32_bias(step.fn)

    def export(self, module: nn.Module, *, pair_safe: bool = False) -> ir.Model:
        """The QDQ model with the module's trained weights, scales and biases."""
        out = copy_model(self.qdq)
        g = out.graph
        by = {n.name: n for n in g}

        def trained(name: str) -> np.ndarray:
            return getattr(module, module.onnx_names[name]).detach().cpu().numpy()

        def put(node: ir.Node, slot: int, array: np.ndarray) -> None:
            value = node.inputs[slot]
            if value.is_initializer() and len(value.uses()) == 1:
                value.const_value = ir.tensor(array, name=value.name)
            else:
                node.replace_input_with(slot, add_initializer(g, array, f"{value.name}_qat"))

        derived = {w for w, _ in self.weights.values()} | {b for b, _ in self.biases.values()}
        for name, value in g.initializers.items():  # float weights left float (a float head)
            attr = module.onnx_names.get(name)
            if (
                name in self.scales
                or name in derived
                or attr is None
                or attr not in dict(module.named_parameters())
            ):
                continue
            old = value.const_value.numpy()
            if old.dtype.kind == "f":
                value.const_value = ir.tensor(
                    trained(name).astype(old.dtype).reshape(old.shape), name=name
                )
        for name in self.scales:  # activation (and weight) scales: shared initializers, tied
            if name in g.initializers:
                old = g.initializers[name].const_value.numpy()
                g.initializers[name].const_value = ir.tensor(
                    np.abs(trained(name)).astype(old.dtype).reshape(old.shape), name=name
                )
        w_scale: dict[str, np.ndarray] = {}
        for dq_name, (w_name, consumer) in self.weights.items():
            dq = by[dq_name]
            scale = const_array(dq.inputs[1]).astype(np.float64)
            codes = const_array(dq.inputs[0])
            axis = dq.attributes["axis"].value if "axis" in dq.attributes else 1
            lo, hi = (
                (-8, 7)
                if self.bits == 4
                else (int(np.iinfo(codes.dtype).min), int(np.iinfo(codes.dtype).max))
            )
            new = np.clip(np.rint(trained(w_name) / _bcast(scale, codes, axis)), lo, hi).astype(
                codes.dtype
            )
            if pair_safe and consumer in by and new.dtype == np.int8:
                new = pairs.limit(by[consumer], new)
            put(dq, 0, new)
            w_scale[consumer] = scale
        for dq_name, (b_name, consumer) in self.biases.items():
            dq, node = by[dq_name], by.get(consumer)
            x_dq = node.inputs[0].producer() if node is not None else None
            if x_dq is None or x_dq.op_type != "DequantizeLinear" or consumer not in w_scale:
                continue
            b = trained(b_name).astype(np.float64)
            bscale = np.maximum(
                float(const_array(x_dq.inputs[1]).reshape(-1)[0])
                * np.broadcast_to(w_scale[consumer].reshape(-1), b.shape),
                1e-12,
            )
            old = const_array(dq.inputs[1])
            put(
                dq,
                1,
                bscale.astype(np.float32).reshape(old.shape)
                if old.size > 1
                else bscale[:1].astype(np.float32).reshape(old.shape),
            )
            put(
                dq,
                0,
                np.clip(np.rint(b / bscale), -(2**31) + 1, 2**31 - 1)
                .astype(np.int32)
                .reshape(const_array(dq.inputs[0]).shape),
            )
        return out


def _with_int32_bias(fn):
    def run(ctx, x, w, b, scale_x, scale_w):
        s = (scale_x.abs().reshape(-1)[0] * scale_w.abs().reshape(-1)).clamp_min(1e-12)
        v = b / s
        return fn(ctx, x, w, (v + (torch.round(v) - v).detach()) * s)

    return run


def _bcast(p: np.ndarray, like: np.ndarray, axis: int) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    if p.size == 1:
        return p.reshape(())
    shape = [1] * like.ndim
    shape[axis % like.ndim] = -1
    return p.reshape(shape)
