"""Which intermediate values of a teacher and a student correspond: transformer hidden states and
the feature maps that end each stage of a CNN.

*Transformers.* A transformer's hidden state after each sub-layer is the output of a
LayerNormalization (post-norm encoders such as BERT normalize every residual sum). The student's
``k``-th of ``n`` states is matched with the teacher's state at the same depth,
``round((k + 1) * m / n) - 1`` of ``m`` (uniform layer mapping, as TinyBERT).

*CNNs* (no LayerNormalization). A stage ends where the resolution changes: its output is the last
4-D feature map ``(N, C, H, W)`` of each spatial size that every path from the input to the
outputs goes through (a residual block's output, not a value inside it, nor a Pad's copy), before
global pooling. These are the "hints" of FitNets (Romero et al., 2015), one per stage. The
student's stage is matched with the teacher's of the same spatial size.

A student made by width reduction keeps the teacher's names, so its values match one to one by
name. Widths that differ get a learned map (linear for hidden states, a 1x1 convolution for
feature maps), initialized by least squares on a sample (``fit_projections``), so the feature loss
starts at the best the student's current values allow and its first gradients are not noise.
"""

from __future__ import annotations

import onnx_ir as ir
import torch
from torch import nn

from modelpress.compress.train import FeaturePair


def hidden_states(model: ir.Model) -> list[ir.Value]:
    """The outputs of the model's LayerNormalization nodes, in graph order."""
    return [
        n.outputs[0] for n in model.graph if n.op_type == "LayerNormalization" and n.outputs[0].name
    ]


def _cut_values(model: ir.Model, shapes: dict) -> list[ir.Value]:
    """Node outputs that every path from the inputs to the outputs goes through, in graph order.

    Walking the graph in order, a value is a cut when, right after it is made, it is the only
    value computed from the inputs that a later node (or an output) still needs. Values of rank
    below 2 (shapes, indices) do not count: they describe a tensor, they do not carry it.
    """
    nodes = list(model.graph)
    last_use: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for v in node.inputs:
            if v is not None and v.name:
                last_use[v.name] = i
    for v in model.graph.outputs:
        last_use[v.name] = len(nodes)
    inputs = {v.name for v in model.graph.inputs if v.name not in model.graph.initializers}
    dynamic, live, cuts = set(inputs), set(inputs), []
    for i, node in enumerate(nodes):
        if not any(v is not None and v.name in dynamic for v in node.inputs):
            continue
        for v in node.outputs:
            if v.name:
                dynamic.add(v.name)
                if len(shapes.get(v.name, ())) >= 2:
                    live.add(v.name)
        live = {n for n in live if last_use.get(n, -1) > i}
        if len(live) == 1 and node.outputs[0].name in live:
            cuts.append(node.outputs[0])
    return cuts


def stage_outputs(model: ir.Model, shapes: dict) -> list[ir.Value]:
    """The last cut feature map of each spatial size above 1x1, in graph order (CNN stages)."""
    last: dict[tuple[int, ...], ir.Value] = {}
    for v in _cut_values(model, shapes):
        shape = shapes.get(v.name, ())
        if len(shape) != 4 or v.producer().op_type == "Pad" or tuple(shape[2:]) == (1, 1):
            continue
        last.pop(tuple(shape[2:]), None)  # re-inserted: the dict keeps the order of stage ends
        last[tuple(shape[2:])] = v
    return list(last.values())


def _pairs_by_depth(
    s_values: list[ir.Value], t_values: list[ir.Value]
) -> list[tuple[ir.Value, ir.Value]]:
    t_names = [v.name for v in t_values]
    n, m = len(s_values), len(t_values)
    out = []
    for k, sv in enumerate(s_values):
        if sv.name in t_names and n == m:
            out.append((sv, t_values[t_names.index(sv.name)]))
        else:
            out.append((sv, t_values[max(0, round((k + 1) * m / n) - 1)]))
    return out


def _pairs_by_size(s_values, t_values, shapes_s, shapes_t) -> list[tuple[ir.Value, ir.Value]]:
    t_by_name = {v.name: v for v in t_values}
    t_by_size = {tuple(shapes_t[v.name][2:]): v for v in t_values}
    out = []
    for sv in s_values:
        tv = t_by_name.get(sv.name)
        if tv is None:
            tv = t_by_size.get(tuple(shapes_s[sv.name][2:]))
        if tv is not None:
            out.append((sv, tv))
    return out


def match(
    teacher: ir.Model, student: ir.Model, shapes_t: dict, shapes_s: dict
) -> list[FeaturePair]:
    """Pairs of corresponding hidden states, or of CNN stage outputs (empty when none correspond).

    ``shapes_t`` and ``shapes_s`` are the probed shapes of every value (``probe_shapes``).
    """
    t_states, s_states = hidden_states(teacher), hidden_states(student)
    if t_states and s_states:
        candidates = _pairs_by_depth(s_states, t_states)
    elif not t_states and not s_states:
        s_maps, t_maps = stage_outputs(student, shapes_s), stage_outputs(teacher, shapes_t)
        candidates = _pairs_by_size(s_maps, t_maps, shapes_s, shapes_t)
    else:
        return []
    pairs = []
    for sv, tv in candidates:
        ss, st = shapes_s.get(sv.name), shapes_t.get(tv.name)
        if not ss or not st or len(ss) != len(st):
            continue
        if len(ss) == 4:
            if ss[2:] != st[2:]:
                continue
            projection = nn.Conv2d(ss[1], st[1], 1, bias=False) if ss[1] != st[1] else None
        else:
            projection = nn.Linear(ss[-1], st[-1], bias=False) if ss[-1] != st[-1] else None
        pairs.append(FeaturePair(sv.name, tv.name, projection))
    return pairs


def fit_projections(pairs: list[FeaturePair], student_values, teacher_values) -> None:
    """Set each pair's projection to the least-squares map from the student's values to the
    teacher's (given as tensors in pair order, computed on the same samples)."""
    for pair, s, t in zip(pairs, student_values, teacher_values):
        if pair.projection is None:
            continue
        channels = 1 if s.dim() == 4 else s.dim() - 1  # feature maps carry channels on axis 1
        a = s.detach().double().movedim(channels, -1).reshape(-1, s.shape[channels])
        b = t.detach().double().movedim(channels, -1).reshape(-1, t.shape[channels])
        # a ridge of 1e-3 of the mean channel energy keeps the map small where student channels
        # are nearly collinear (a randomly initialized student) or dead on the sample
        gram = a.T @ a
        gram = gram + 1e-3 * gram.diagonal().mean() * torch.eye(a.shape[1], dtype=a.dtype)
        w = torch.linalg.solve(gram, a.T @ b).T  # (teacher width, student width)
        with torch.no_grad():
            weight = pair.projection.weight
            weight.copy_(w.reshape(weight.shape).to(weight.dtype))
