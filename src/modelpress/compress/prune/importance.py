"""How much each removable component matters: a score per component, lowest pruned first.

A component's score adds up, over every slice it owns in every layer of its group (the filter
that writes a channel *and* the weight columns that read it), a per-entry measure:

- ``activation`` (default): for every layer that *reads* the component, the absolute weights of the
  columns that read it, each times the root mean square of the input entry it multiplies, measured
  on sample batches (the structured form of Wanda, Sun et al. 2023): how much the component adds to
  what the next layers compute. The filters that *write* the component do not count: a
  BatchNorm after them normalizes their scale away, and what the channel carries (BatchNorm scale
  and shift, activation included) is in the measured input. Where a BatchNorm normalizes the
  reading layer's own outputs (a Conv or Gemm whose output only it reads), each output row of the
  weight counts times that BatchNorm's scale, as it would once folded. So the scores are the same
  whether the BatchNorms are folded into the convolutions or not. A group none of whose components
  is read by a weight (or whose inputs could not be measured) falls back to ``l1``;
- ``l1``: sum of absolute weights; ``l2``: root of the sum of squares (weights of Conv, Gemm and
  MatMul only: biases and statistics say little about a channel's use);
- ``bn``: the absolute BatchNorm scale (Liu et al., "network slimming"); groups with no
  BatchNorm fall back to ``l1``;
- ``taylor``: first-order Taylor, |w · ∂L/∂w| summed over the slices' trainable entries and over
  a few batches of the training loss (Molchanov et al. 2019): the loss change a removal causes.

A component whose every slice is zero scores 0 under each measure, and removing it leaves the
outputs unchanged (the test of the analysis).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from modelpress.compress.prune.depgraph import DepGraph, Slice, param
from modelpress.errors import OptionError
from modelpress.ir.graph import copy_model
from modelpress.ir.match import attr, values_by_name
from modelpress.ir.shapes import ensure_types
from modelpress.runtime.ort import session

ROLES = {
    "activation": {"weight"},
    "l1": {"weight"},
    "l2": {"weight"},
    "bn": {"scale"},
    "taylor": {"weight", "bias", "scale", "shift", "norm", "param"},
}
METHODS = tuple(ROLES)


def _per_index(array: np.ndarray, axis: int, measure: str) -> np.ndarray:
    moved = np.moveaxis(np.asarray(array, dtype=np.float64), axis, 0).reshape(array.shape[axis], -1)
    if measure == "l2":
        return (moved**2).sum(axis=1)
    return np.abs(moved).sum(axis=1)


def _unit_entries(s: Slice, per_index: np.ndarray, units: int) -> np.ndarray:
    """``(units, block)``: the measure of each entry of each unit of ``s.value``."""
    local = np.arange(units) % s.modulus if s.modulus else np.arange(units)
    return per_index.reshape(-1, s.block)[local]


def slice_units(s: Slice, per_index: np.ndarray, units: int) -> np.ndarray:
    """The measure of each unit of ``s.value`` from the measure of each entry along the axis."""
    return _unit_entries(s, per_index, units).sum(axis=1)


def writes(s: Slice) -> bool:
    """True when ``s`` belongs to the value its node computes (a filter), not to one it reads."""
    return any(o is not None and o.name == s.value for o in s.node.outputs)


def input_rms(dg: DepGraph, batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Value name → root mean square of each entry along its tracked axis, over ``batches``, for
    every tracked value a weight reads (one ONNX Runtime session; values it cannot type are left out).
    """
    wanted = sorted({s.value for s in dg.slices if s.role == "weight" and not writes(s)})
    if not wanted or not batches:
        return {}
    m = copy_model(dg.model)
    ensure_types(m)
    values = values_by_name(m.graph)
    present = {v.name for v in m.graph.outputs}
    names = [n for n in wanted if n in values and (n in present or values[n].type is not None)]
    for n in names:
        if n not in present:
            m.graph.outputs.append(values[n])
    sess = session(m, optimize="disabled")
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    for feeds in batches:
        for n, x in zip(names, sess.run(names, feeds)):
            t = dg.tracks[n]
            x = np.moveaxis(np.asarray(x, dtype=np.float64), t.axis, 0).reshape(t.size, -1)
            sums[n] = sums.get(n, 0.0) + (x * x).sum(axis=1)
            counts[n] = counts.get(n, 0) + x.shape[1]
    return {n: np.sqrt(sums[n] / max(counts[n], 1)) for n in sums}


def scores(
    dg: DepGraph,
    method: str,
    *,
    taylor: dict[str, np.ndarray] | None = None,
    activations: dict[str, np.ndarray] | None = None,
) -> dict:
    """Component id → score. ``taylor``: accumulated |w·g| per initializer name (``taylor_terms``);
    ``activations``: the RMS of each read value's entries (``input_rms``)."""
    if method not in ROLES:
        raise OptionError(f"importance {method!r}: choose one of {', '.join(METHODS)}")
    if method == "taylor" and taylor is None:
        raise OptionError("taylor importance needs training data to take gradients on")
    if method == "activation" and activations is None:
        raise OptionError(
            "activation importance needs sample inputs to measure the layers' inputs on"
        )
    out = _scores(dg, method, taylor, activations)
    if method in ("bn", "activation"):
        # a group with nothing to read (no BatchNorm; no weight reading it) is ranked by l1
        fallback = _scores(dg, "l1", None, None)
        for group in dg.groups:
            if not any(out.get(c, 0.0) for c in group.components):
                for c in group.components:
                    out[c] = fallback.get(c, 0.0)
    if method == "l2":
        out = {c: float(np.sqrt(v)) for c, v in out.items()}
    return out


def _scores(
    dg: DepGraph,
    method: str,
    taylor: dict[str, np.ndarray] | None,
    activations: dict[str, np.ndarray] | None,
) -> dict:
    roles = ROLES[method]
    measure = "l2" if method == "l2" else "l1"
    out: dict = {}
    for s in dg.slices:
        if s.role not in roles:
            continue
        if activations is not None:
            rms = activations.get(s.value)
            if rms is None or writes(s):
                continue
        value = s.node.inputs[s.input]
        if taylor is not None:
            array = taylor.get(_source_name(value))
            if array is None:
                continue
        else:
            array = param(value)
        if activations is not None:
            array = _normalized_rows(dg, s, array)
        per_index = _per_index(array, s.axis, measure)
        units = dg.tracks[s.value].units
        if activations is not None:
            entries = _unit_entries(s, per_index, units)
            by_unit = rms.reshape(units, -1)
            if by_unit.shape[1] != entries.shape[1]:  # the value's blocks differ from the weight's
                by_unit = np.sqrt((by_unit**2).mean(axis=1, keepdims=True))
            unit_scores = (entries * by_unit).sum(axis=1)
        else:
            unit_scores = slice_units(s, per_index, units)
        for u, v in enumerate(unit_scores):
            c = dg.uf.find((s.value, u))
            out[c] = out.get(c, 0.0) + float(v)
    return out


def _normalized_rows(dg: DepGraph, s: Slice, array: np.ndarray) -> np.ndarray:
    """The weight of ``s`` with each output row times the scale of the inference BatchNorm that
    alone reads the node's output (``array`` itself when there is none)."""
    node = s.node
    if s.input != 1 or node.op_type not in ("Conv", "Gemm"):
        return array
    uses = node.outputs[0].uses()
    if len(uses) != 1 or uses[0].idx != 0 or node.outputs[0].is_graph_output():
        return array
    bn = uses[0].node
    if (
        bn.op_type != "BatchNormalization"
        or len(bn.inputs) != 5
        or len(bn.outputs) != 1
        or attr(bn, "training_mode", 0)
    ):
        return array
    gamma, var = param(bn.inputs[1]), param(bn.inputs[4])  # through Identity: exporters share them
    axis = 1 if node.op_type == "Gemm" and not attr(node, "transB", 0) else 0
    if gamma is None or var is None or gamma.shape != var.shape or gamma.size != array.shape[axis]:
        return array
    scale = np.abs(gamma.astype(np.float64)) / np.sqrt(
        var.astype(np.float64) + float(attr(bn, "epsilon", 1e-5))
    )
    shape = [1] * array.ndim
    shape[axis] = scale.size
    return np.asarray(array, dtype=np.float64) * scale.reshape(shape)


def _source_name(value) -> str:
    """The initializer behind a constant input (through an Identity)."""
    node = value.producer()
    if node is not None and node.op_type == "Identity" and node.inputs[0] is not None:
        return node.inputs[0].name
    return value.name


def taylor_terms(
    model,
    batches: list,
    loss_of: Callable,
) -> dict[str, np.ndarray]:
    """|w · ∂L/∂w| per initializer of ``model``, summed over ``batches``.

    ``loss_of(module, batch)`` returns the scalar loss of one batch for the module built from
    ``model`` (the training objective).
    """
    from modelpress.compress.train import trainable

    module = trainable(model)
    names = {key: name for name, key in module.onnx_names.items()}
    acc: dict[str, np.ndarray] = {}
    for batch in batches:
        module.zero_grad(set_to_none=True)
        loss_of(module, batch).backward()
        for key, p in module.named_parameters():
            if p.grad is None or key not in names:
                continue
            term = (p.detach() * p.grad).abs().cpu().numpy().astype(np.float64)
            name = names[key]
            acc[name] = acc[name] + term if name in acc else term
    return acc
