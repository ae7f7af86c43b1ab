"""What a search returns: its trials, the Pareto front, the winner (or the closest found), and
the events its progress callback is told."""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_ir as ir

from modelpress.search import pareto
from modelpress.search.recipe import Recipe
from modelpress.search.trial import Trial


@dataclass
class SearchEvent:
    """What the progress callback is told after each trial (``kind``: ``trial`` or ``cached``)
    and once at the end (``done``)."""

    kind: str
    trial: Trial | None
    trials: int  # trials so far, cached ones included
    elapsed_s: float
    budget_s: float
    best: Trial | None
    met: bool


@dataclass
class AutoResult:
    model: ir.Model | None
    winner: Trial | None
    met: bool
    max_accuracy_drop: float
    metric: str
    reference: Trial
    trials: list[Trial]
    front: list[Trial]
    evaluated: int
    cached: int
    stopped: str
    target: str
    estimated: bool
    seconds: float
    space: dict
    recipe: Recipe | None = None
    notes: list[str] = field(default_factory=list)
    split: dict | None = None  # the validation split of labelled data (``split.Split.to_dict``)

    @property
    def reference_ms(self) -> float:
        return (
            float(self.reference.latency["median_ms"]) if self.reference.latency else float("nan")
        )

    def latency_ms(self, t: Trial) -> float | None:
        """A trial's latency on the scale of the original's latency measured in this search."""
        return None if t.ratio is None else t.ratio * self.reference_ms

    @property
    def default(self) -> Trial | None:
        """The trial of what a user would try by hand: the optimizer's default level, then
        static int8 with its default observer."""
        for t in self.trials:
            q = [s["quantize"] for s in t.steps if "quantize" in s]
            o = [s["optimize"] for s in t.steps if "optimize" in s]
            if (
                len(t.steps) == 2
                and q
                and o
                and q[0].get("mode") == "static"
                and q[0].get("method") == "minmax"
                and not q[0].get("exclude")
                and o[0].get("level") == 2
            ):
                return t
        return None

    @property
    def shortfall(self) -> float | None:
        """How far the best found is from the budget (0 when within it)."""
        if self.winner is None or self.winner.drop is None:
            return None
        return max(self.winner.drop - self.max_accuracy_drop, 0.0)

    def _trial(self, t: Trial, *, layers: bool = False) -> dict:
        d = t.to_dict()
        d["latency_ms"] = self.latency_ms(t)
        if t.latency:
            # the spread on the same scale as the median (the original's latency in this search)
            scale = self.reference_ms / max(t.latency["reference_ms"], 1e-12)
            d["latency_p25_ms"] = t.latency["p25_ms"] * scale
            d["latency_p75_ms"] = t.latency["p75_ms"] * scale
        d["within_budget"] = pareto.within(t, self.max_accuracy_drop)
        if not layers:
            d.pop("layers", None)
        return d

    def to_dict(self) -> dict:
        front = {t.key for t in self.front}
        return {
            "metric": self.metric,
            "max_accuracy_drop": self.max_accuracy_drop,
            "met": self.met,
            "shortfall": self.shortfall,
            "target": self.target,
            "estimated": self.estimated,
            "stopped": self.stopped,
            "evaluated": self.evaluated,
            "cached": self.cached,
            "seconds": round(self.seconds, 3),
            "space": self.space,
            "reference": self._trial(self.reference),
            "winner": self._trial(self.winner, layers=True) if self.winner else None,
            "default": self._trial(self.default) if self.default else None,
            "trials": [dict(self._trial(t), on_front=t.key in front) for t in self.trials],
            "front": [t.key for t in self.front],
            "recipe": self.recipe.to_dict() if self.recipe else None,
            "split": self.split,
            "notes": self.notes,
        }


__all__ = ["AutoResult", "SearchEvent"]
