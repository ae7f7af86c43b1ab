"""Structured pruning: which components go, and the one-shot or iterative schedule.

``choose(dg, scores, ...)`` removes from each group the fraction ``ratio`` of its units (attention
heads: ``head_ratio``) with the lowest scores, never more than its removable components and never
its last unit; with ``round_to`` the units kept are a multiple of it (8 or 16 suit vectorized CPU
kernels). ``global_ranking`` instead ranks the components of all groups of a kind (channels,
neurons, heads) together, removing the same total of each kind with at most ``max_group_ratio`` of
any one group: by their score divided by their group's mean score (so layers of different sizes
compare), or by the score itself where scores already compare across layers (``obs`` for neurons and heads:
the error each removal adds to the output of the layer that reads the unit).

``prune_step(model, feeds, ...)`` analyzes the model, scores and removes once; the iterative
schedule (``api.prune``) calls it ``steps`` times with the keep fraction falling linearly to
``1 - ratio``, fine-tuning in between.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from modelpress.compress.prune import calibration as calib
from modelpress.compress.prune import importance as imp
from modelpress.compress.prune import surgery
from modelpress.compress.prune.analyzer import analyze
from modelpress.compress.prune.depgraph import DepGraph, probe_shapes
from modelpress.compress.prune.refit import obs_scores
from modelpress.compress.prune.refit import refit as refit_readers
from modelpress.errors import OptionError
from modelpress.ir.graph import copy_model


def _target_keep(size: int, ratio: float, round_to: int) -> int:
    keep = max(1, size - int(round(ratio * size)))
    if round_to > 1:
        keep = min(size, math.ceil(keep / round_to) * round_to)
    return keep


def _removable(g, ratio: float, round_to: int) -> int:
    """How many of group ``g``'s units a ratio of ``ratio`` removes (never a blocked one)."""
    return max(0, min(len(g.components), g.size - _target_keep(g.size, ratio, round_to)))


def choose(
    dg: DepGraph,
    scores: dict,
    *,
    ratio: float,
    head_ratio: float | None = None,
    round_to: int = 1,
    global_ranking: bool = False,
    comparable: tuple[str, ...] = (),
    max_group_ratio: float = 0.9,
) -> set:
    """The components to remove (see the module docstring)."""

    def ratio_of(kind: str) -> float:
        return head_ratio if (kind == "heads" and head_ratio is not None) else ratio

    removed: set = set()
    if global_ranking:
        for kind in dict.fromkeys(g.kind for g in dg.groups):
            removed |= _global(
                dg,
                scores,
                kind,
                ratio_of(kind),
                round_to=round_to,
                comparable=kind in comparable,
                max_group_ratio=max_group_ratio,
            )
        return removed
    for g in dg.groups:
        n = _removable(g, ratio_of(g.kind), round_to)
        removed.update(sorted(g.components, key=lambda c: scores.get(c, 0.0))[:n])
    return removed


def _global(
    dg: DepGraph,
    scores: dict,
    kind: str,
    ratio: float,
    *,
    round_to: int,
    comparable: bool,
    max_group_ratio: float,
) -> set:
    """The lowest-ranked ``ratio`` of the units of every group of ``kind``, ranked together."""
    groups = [g for g in dg.groups if g.kind == kind]
    # as many units as a ratio per group removes: groups that cannot lose any do not add to it
    budget = sum(_removable(g, ratio, round_to) for g in groups)
    caps, ranked = {}, []
    for g in groups:
        caps[g.index] = _removable(g, max_group_ratio, round_to)
        mean = (
            1.0
            if comparable
            else float(np.mean([scores.get(c, 0.0) for c in g.components] or [1.0]))
        )
        ranked += [(scores.get(c, 0.0) / (mean or 1.0), g.index, c) for c in g.components]
    ranked.sort(key=lambda t: (t[0], t[1]))
    removed: set = set()
    taken = dict.fromkeys(caps, 0)
    for _, gi, c in ranked:
        if len(removed) >= budget:
            break
        if taken[gi] < caps[gi]:
            removed.add(c)
            taken[gi] += 1
    return removed


@dataclass
class StepReport:
    removed_units: int
    removed_params: int
    groups: list[dict]

    def to_dict(self) -> dict:
        return {
            "removed_units": self.removed_units,
            "removed_params": self.removed_params,
            "groups": self.groups,
        }


def prune_step(
    model: ir.Model,
    feeds: dict[str, np.ndarray],
    *,
    ratio: float,
    head_ratio: float | None,
    method: str,
    keep: list[str],
    round_to: int,
    global_ranking: bool,
    taylor: dict[str, np.ndarray] | None = None,
    calibration: list | None = None,
    refit: bool = False,
) -> tuple[ir.Model, StepReport]:
    """One analysis and removal on a copy of ``model``; ``feeds`` (a sample batch) sizes the graph.

    ``calibration`` (``Batch``es of samples; default: ``feeds``) is what the data-aware methods
    measure on: ``activation`` the inputs of the layers that read each channel, ``fisher`` and
    ``obs`` (``calibration.METHODS``) the neurons and heads through the layers that read them;
    with ``refit``, the least-squares refit of those layers after the removal."""
    if not 0 <= ratio < 1 or (head_ratio is not None and not 0 <= head_ratio < 1):
        raise OptionError(
            f"pruning ratio {ratio if not 0 <= ratio < 1 else head_ratio}: choose a fraction in [0, 1)"
        )
    shapes = probe_shapes(model, feeds)
    dg = analyze(copy_model(model), shapes, keep=keep)
    readers = []
    if calibration is not None and (method in calib.METHODS or refit):
        readers = calib.readers(dg)
        calib.observe(model, readers, calibration)
    if method in calib.METHODS:
        if calibration is None:
            raise OptionError(
                f"{method} importance needs training data (samples to measure the units on)"
            )
        scores = obs_scores(dg, readers) if method == "obs" else calib.scores(dg, readers)
    else:
        batches = [b.feeds for b in calibration] if calibration is not None else [feeds]
        activations = imp.input_rms(dg, batches) if method == "activation" else None
        scores = imp.scores(dg, method, taylor=taylor, activations=activations)
    removed = choose(
        dg,
        scores,
        ratio=ratio,
        head_ratio=head_ratio,
        round_to=round_to,
        global_ranking=global_ranking,
        comparable=calib.KINDS if method == "obs" else (),
    )
    if refit and readers:
        refit_readers(dg, readers, removed)
    groups = []
    for g in dg.groups:
        gone = sum(1 for c in g.components if c in removed)
        groups.append({**g.to_dict(), "removed": gone})
    params = surgery.remove(dg, removed)
    return dg.model, StepReport(len(removed), params, groups)


def analyze_model(
    model: ir.Model, feeds: dict[str, np.ndarray], *, keep: list[str] = ()
) -> DepGraph:
    """The dependency groups of ``model`` (on a copy), sized by the sample ``feeds``."""
    return analyze(copy_model(model), probe_shapes(model, feeds), keep=keep)
