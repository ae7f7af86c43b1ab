"""How much each removable component matters: a score per component, lowest pruned first.

A component's score adds up, over every slice it owns in every layer of its group (the filter
that writes a channel *and* the weight columns that read it), a per-entry measure:

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

ROLES = {
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


def slice_units(s: Slice, per_index: np.ndarray, units: int) -> np.ndarray:
    """The measure of each unit of ``s.value`` from the measure of each entry along the axis."""
    per_local = per_index.reshape(-1, s.block).sum(axis=1)
    local = np.arange(units) % s.modulus if s.modulus else np.arange(units)
    return per_local[local]


def scores(dg: DepGraph, method: str, *, taylor: dict[str, np.ndarray] | None = None) -> dict:
    """Component id → score. ``taylor``: accumulated |w·g| per initializer name (``taylor_terms``)."""
    if method not in ROLES:
        raise OptionError(f"importance {method!r}: choose one of {', '.join(METHODS)}")
    if method == "taylor" and taylor is None:
        raise OptionError("taylor importance needs training data to take gradients on")
    out = _scores(dg, method, taylor)
    if method == "bn":
        # a group without BatchNorm has nothing to read: it is ranked by l1
        fallback = _scores(dg, "l1", None)
        for group in dg.groups:
            if not any(out.get(c, 0.0) for c in group.components):
                for c in group.components:
                    out[c] = fallback.get(c, 0.0)
    if method == "l2":
        out = {c: float(np.sqrt(v)) for c, v in out.items()}
    return out


def _scores(dg: DepGraph, method: str, taylor: dict[str, np.ndarray] | None) -> dict:
    roles = ROLES[method]
    measure = "l2" if method == "l2" else "l1"
    out: dict = {}
    for s in dg.slices:
        if s.role not in roles:
            continue
        value = s.node.inputs[s.input]
        if taylor is not None:
            array = taylor.get(_source_name(value))
            if array is None:
                continue
        else:
            array = param(value)
        per_index = _per_index(array, s.axis, measure)
        units = dg.tracks[s.value].units
        for u, v in enumerate(slice_units(s, per_index, units)):
            c = dg.uf.find((s.value, u))
            out[c] = out.get(c, 0.0) + float(v)
    return out


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
    names = {attr: name for name, attr in module.onnx_names.items()}
    acc: dict[str, np.ndarray] = {}
    for batch in batches:
        module.zero_grad(set_to_none=True)
        loss_of(module, batch).backward()
        for attr, p in module.named_parameters():
            if p.grad is None or attr not in names:
                continue
            term = (p.detach() * p.grad).abs().cpu().numpy().astype(np.float64)
            name = names[attr]
            acc[name] = acc[name] + term if name in acc else term
    return acc
