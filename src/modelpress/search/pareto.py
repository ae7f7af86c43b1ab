"""The Pareto front of a search (latency, size, accuracy drop) and the choice of the winner.

A trial dominates another when it is no worse on all three objectives and better on one. Latency is
compared as the ratio to the original measured in the same run (``Latency.ratio``), which keeps
trials timed minutes apart on a shared machine comparable.

The winner is the fastest trial within the accuracy budget; trials within ``TIE`` of the fastest
are one speed (timing noise is larger than that), and among them the smallest file wins, then the
smallest drop. When no trial is within the budget, the closest one (smallest drop, then fastest)
is the best found.
"""

from __future__ import annotations

from modelpress.search.trial import Trial

TIE = 0.02


def within(trial: Trial, budget: float) -> bool:
    """A trial that verified lossless, or whose drop is at most ``budget``."""
    return trial.ok and (trial.lossless or (trial.drop is not None and trial.drop <= budget))


def _objectives(t: Trial) -> tuple[float, float, float]:
    return (t.ratio, float(t.size_bytes), max(t.drop, 0.0))


def dominates(a: Trial, b: Trial) -> bool:
    oa, ob = _objectives(a), _objectives(b)
    return all(x <= y for x, y in zip(oa, ob)) and any(x < y for x, y in zip(oa, ob))


def front(trials: list[Trial]) -> list[Trial]:
    """The trials no other trial dominates, fastest first (ties: the first met is kept)."""
    ok = [t for t in trials if t.ok and t.ratio is not None and t.drop is not None]
    out: list[Trial] = []
    for t in ok:
        if any(dominates(o, t) for o in ok):
            continue
        if any(_objectives(o) == _objectives(t) for o in out):
            continue
        out.append(t)
    return sorted(out, key=_objectives)


def choose(trials: list[Trial], budget: float) -> tuple[Trial | None, bool]:
    """(the winner, whether it is within the budget); (None, False) when no trial succeeded."""
    ok = [t for t in trials if t.ok and t.ratio is not None and t.drop is not None]
    if not ok:
        return None, False
    met = [t for t in ok if within(t, budget)]
    if met:
        fastest = min(t.ratio for t in met)
        near = [t for t in met if t.ratio <= fastest * (1 + TIE)]
        return min(near, key=lambda t: (t.size_bytes, max(t.drop, 0.0), t.ratio)), True
    return min(ok, key=lambda t: (t.drop, t.ratio)), False


__all__ = ["TIE", "choose", "dominates", "front", "within"]
