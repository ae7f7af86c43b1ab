"""Which intermediate values of a teacher and a student correspond: transformer hidden states.

A transformer's hidden state after each sub-layer is the output of a LayerNormalization (post-norm
encoders such as BERT normalize every residual sum). The student's ``k``-th of ``n`` states is
matched with the teacher's state at the same depth, ``round((k + 1) * m / n) - 1`` of ``m``
(uniform layer mapping, as TinyBERT); a student made by width reduction keeps the teacher's names
and hidden size, so its states match one to one. Widths that differ get a learned linear map.
"""

from __future__ import annotations

import onnx_ir as ir
from torch import nn

from modelpress.compress.train import FeaturePair


def hidden_states(model: ir.Model) -> list[ir.Value]:
    """The outputs of the model's LayerNormalization nodes, in graph order."""
    return [n.outputs[0] for n in model.graph if n.op_type == "LayerNormalization" and n.outputs[0].name]


def _width(value: ir.Value, shapes: dict[str, tuple[int, ...]]) -> int | None:
    shape = shapes.get(value.name)
    return int(shape[-1]) if shape else None


def match(teacher: ir.Model, student: ir.Model, shapes_t: dict, shapes_s: dict) -> list[FeaturePair]:
    """Pairs of corresponding hidden states (empty when either model has none)."""
    t_states, s_states = hidden_states(teacher), hidden_states(student)
    if not t_states or not s_states:
        return []
    t_names = [v.name for v in t_states]
    pairs = []
    n, m = len(s_states), len(t_states)
    for k, sv in enumerate(s_states):
        if sv.name in t_names and n == m:
            tv = t_states[t_names.index(sv.name)]
        else:
            tv = t_states[max(0, round((k + 1) * m / n) - 1)]
        ws, wt = _width(sv, shapes_s), _width(tv, shapes_t)
        if ws is None or wt is None:
            continue
        projection = nn.Linear(ws, wt, bias=False) if ws != wt else None
        pairs.append(FeaturePair(sv.name, tv.name, projection))
    return pairs
