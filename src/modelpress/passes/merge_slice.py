"""Consecutive Slices merge into one Slice.

``Slice(Slice(x, p1), p2)`` → ``Slice(x, p)``. Precondition (``check``): both Slices are in the same
graph, every parameter is constant and, axis by axis:

- the axis is sliced by only one of the two: its parameters carry over unchanged (any step);
- both slice it with step 1: on an axis of size ``d``, ``x[s1:e1][s2:e2]`` is ``x[s1+s2 :
  min(e1, s1+e2)]`` once the bounds are clamped as Slice clamps them. With ``d`` unknown this
  holds for non-negative bounds (Slice clamps them to ``d`` itself); negative bounds need ``d``
  known, to be normalized first. Other steps are left alone.

Negative axes are normalized with the rank when it is known; when it is not, both Slices must use
axes of the same sign to be compared. The inner Slice goes once nothing else uses it.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelpress.ir.graph import make_slice, replace_with_new
from modelpress.ir.match import graph_opset, known_rank, slice_params
from modelpress.passes.rule import Pair, PairRewritePass

_INT64_MAX = 2**63 - 1


def _clamp_bound(v: int, d: int) -> int:
    # Slice with a positive step: negative bounds count from the end, then clamp to [0, d].
    return min(max(v + d if v < 0 else v, 0), d)


def _compose(s1: int, e1: int, s2: int, e2: int, dim: int | None) -> tuple[int, int] | None:
    """The bounds of ``x[s1:e1][s2:e2]`` (step 1) on an axis of size ``dim``; None if unknown."""
    if dim is not None:
        s1, e1 = _clamp_bound(s1, dim), _clamp_bound(e1, dim)
        length = max(e1 - s1, 0)
        s2, e2 = _clamp_bound(s2, length), _clamp_bound(e2, length)
    elif min(s1, e1, s2, e2) < 0:
        return None
    return min(s1 + s2, _INT64_MAX), min(e1, s1 + e2, _INT64_MAX)


@dataclass
class _Match(Pair):
    # derived by the check: (starts, ends, axes, steps) of the merged Slice
    merged: tuple[list[int], list[int], list[int], list[int]] | None = None


class MergeSlice(PairRewritePass[_Match]):
    """Slice(Slice(x)) → one Slice, on disjoint axes or step-1 slices of the same axis."""

    name = "merge-slice"
    ops = ("Slice",)
    match_type = _Match

    def check_pair(self, graph, m: _Match) -> str | None:
        p1, p2 = slice_params(m.inner), slice_params(m.outer)
        if p1 is None or p2 is None:
            return "a Slice's parameters are not all constant"
        x = m.inner.inputs[0]
        rank = known_rank(x)
        axes1, axes2 = p1[2], p2[2]
        if rank is not None:
            axes1 = [a + rank if a < 0 else a for a in axes1]
            axes2 = [a + rank if a < 0 else a for a in axes2]
        elif len({a < 0 for a in axes1 + axes2}) > 1:
            return "the rank is unknown and the axes mix signs (-1 and 2 may be one axis)"
        entries = {a: [s, e, st] for s, e, a, st in zip(p1[0], p1[1], axes1, p1[3], strict=True)}
        for s2, e2, a, st2 in zip(p2[0], p2[1], axes2, p2[3], strict=True):
            if a not in entries:
                entries[a] = [s2, e2, st2]
                continue
            s1, e1, st1 = entries[a]
            if st1 != 1 or st2 != 1:
                return f"both slice axis {a}, not both with step 1"
            dim = None
            if rank is not None and x.shape is not None and isinstance(x.shape[a], int):
                dim = x.shape[a]
            bounds = _compose(s1, e1, s2, e2, dim)
            if bounds is None:
                return f"axis {a} has negative bounds and no known size to normalize them"
            entries[a] = [bounds[0], bounds[1], 1]
        axes = sorted(entries)
        m.merged = (
            [entries[a][0] for a in axes],
            [entries[a][1] for a in axes],
            axes,
            [entries[a][2] for a in axes],
        )
        return None

    def rewrite(self, graph, m: _Match) -> int:
        out = m.outer.outputs[0]
        new = make_slice(
            graph,
            m.outer,
            m.inner.inputs[0],
            m.merged,
            opset=graph_opset(graph, self.model),
            like=out,
            name_hint=f"{out.name}_slice",
        )
        replace_with_new(out, new.outputs[0])
        return self.remove_pair(graph, m)
