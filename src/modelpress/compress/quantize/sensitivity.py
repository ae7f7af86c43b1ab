"""How much each quantized layer costs in accuracy, and the search that keeps the most sensitive
layers in float until an accuracy budget holds.

- ``layer_errors``: run the float and the quantized model on the same batches and compare each
  quantized layer's output: SQNR in dB (``10·log10(Σf² / Σ(f−q)²)``) and relative error
  (``‖f−q‖ / ‖f‖``), accumulated over batches with fixed-size state; for sequence models the
  positions an attention-mask input marks as padding are left out.
- ``rank_layers``: a layer's sensitivity is the relative error of the model's outputs when only that
  layer is quantized (errors of other layers do not mask it).
- ``budget_search``: binary search on how many of the most sensitive layers stay float, for the
  fewest that keep ``metric(float) − metric(quantized) ≤ budget``; every candidate evaluated is
  remembered and the best one is returned even when none meets the budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from modelpress.compress.quantize.calibration import fetching
from modelpress.ir.match import values_by_name
from modelpress.runtime.ort import session
from modelpress.verify.metrics import relative_error, sqnr_db

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


@dataclass
class LayerReport:
    name: str
    op_type: str
    quantized: bool
    sqnr_db: float | None = None
    rel_error: float | None = None
    sensitivity: float | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class BudgetResult:
    metric_float: float
    metric_quantized: float  # of the model returned
    budget: float
    met: bool
    kept_float: list[str] = field(default_factory=list)
    tried: list[tuple[int, float]] = field(default_factory=list)  # (layers kept float, metric)

    @property
    def drop(self) -> float:
        return self.metric_float - self.metric_quantized

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["drop"] = self.drop
        return d


def runner(model: ir.Model, *, outputs: Iterable[str] = (), optimize: str = "all") -> Runner:
    """A function ``feeds → outputs by name`` for ``model``, with extra tensors fetched as outputs."""

    extra = [n for n in outputs if n not in {v.name for v in model.graph.outputs}]
    sess = session(fetching(model, extra), optimize=optimize)
    names = [o.name for o in sess.get_outputs()]
    inputs = {i.name for i in sess.get_inputs()}

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = dict(
            zip(
                names, sess.run(names, {k: v for k, v in feeds.items() if k in inputs}), strict=True
            )
        )
        out.update({k: v for k, v in feeds.items() if k in extra})
        return out

    return run


def layer_errors(
    float_model: ir.Model,
    quant_model: ir.Model,
    pairs: dict[str, tuple[str, str]],
    batches: Iterable[dict[str, np.ndarray]],
) -> dict[str, tuple[float, float]]:
    """``{layer: (sqnr_db, rel_error)}`` for each layer's (float tensor, quantized tensor) pair."""
    qvals = values_by_name(quant_model.graph)
    pairs = {k: v for k, v in pairs.items() if v[1] in qvals}
    run_f = runner(float_model, outputs=[f for f, _ in pairs.values()], optimize="disabled")
    run_q = runner(quant_model, outputs=[q for _, q in pairs.values()], optimize="disabled")
    sig = dict.fromkeys(pairs, 0.0)
    err = dict.fromkeys(pairs, 0.0)
    for feeds in batches:
        of, oq = run_f(feeds), run_q(feeds)
        mask = _token_mask(feeds)
        for layer, (fn, qn) in pairs.items():
            a = of[fn].astype(np.float64)
            b = oq[qn].astype(np.float64)
            if a.shape != b.shape:
                continue
            if mask is not None and a.ndim >= 3 and a.shape[:2] == mask.shape:
                a, b = a[mask], b[mask]  # padded positions are "don't care" values
            sig[layer] += float(np.sum(a * a))
            err[layer] += float(np.sum((a - b) ** 2))
    out = {}
    for layer in pairs:
        s, e = sig[layer], err[layer]
        out[layer] = (sqnr_db(s, e), relative_error(s, e))
    return out


def _token_mask(feeds: dict[str, np.ndarray]) -> np.ndarray | None:
    """The attention mask of a sequence model (an integer ``[batch, seq]`` input named ``*mask*``):
    hidden states of padded tokens never reach the outputs and would swamp the comparison."""
    for name, v in feeds.items():
        if "mask" in name.lower() and v.ndim == 2 and np.issubdtype(v.dtype, np.integer):
            return v != 0
    return None


def output_error(run_a: Runner, run_b: Runner, batches: Iterable[dict[str, np.ndarray]]) -> float:
    """Relative error ``‖a − b‖ / ‖a‖`` over all outputs and batches."""
    s = e = 0.0
    for feeds in batches:
        oa, ob = run_a(feeds), run_b(feeds)
        for k, a in oa.items():
            if k in ob and np.issubdtype(np.asarray(a).dtype, np.floating):
                a64 = a.astype(np.float64)
                s += float(np.sum(a64 * a64))
                e += float(np.sum((a64 - ob[k].astype(np.float64)) ** 2))
    return math.sqrt(e / s) if s > 0 else 0.0


def rank_layers(
    float_model: ir.Model,
    layers: list[str],
    build: Callable[[frozenset[str]], ir.Model],
    batches: list[dict[str, np.ndarray]],
) -> dict[str, float]:
    """Sensitivity of each layer: the output error when it alone is quantized."""
    run_f = runner(float_model)
    out = {}
    everything = frozenset(layers)
    for name in layers:
        q = build(everything - {name})
        out[name] = output_error(run_f, runner(q), batches)
    return out


def budget_search(
    ranked: list[str],
    build: Callable[[frozenset[str]], ir.Model],
    evaluate: Callable[[ir.Model], float],
    *,
    metric_float: float,
    budget: float,
    first: tuple[ir.Model, float],
) -> tuple[ir.Model, BudgetResult]:
    """Keep the ``k`` most sensitive layers (``ranked``, most sensitive first) in float, for the
    smallest ``k`` found whose drop is within ``budget``; ``first`` is the model with ``k = 0``."""
    tried: dict[int, tuple[ir.Model, float]] = {0: first}

    def score(k: int) -> float:
        if k not in tried:
            model = build(frozenset(ranked[:k]))
            tried[k] = (model, evaluate(model))
        return tried[k][1]

    def ok(k: int) -> bool:
        return metric_float - score(k) <= budget

    lo, hi = 0, len(ranked)
    if not ok(0):
        if ok(hi):
            while hi - lo > 1:  # invariant: lo fails, hi holds
                mid = (lo + hi) // 2
                if ok(mid):
                    hi = mid
                else:
                    lo = mid
            best_k = hi
        else:
            best_k = max(tried, key=lambda k: (tried[k][1], -k))
    else:
        best_k = 0
    model, metric = tried[best_k]
    return model, BudgetResult(
        metric_float=metric_float,
        metric_quantized=metric,
        budget=budget,
        met=metric_float - metric <= budget,
        kept_float=ranked[:best_k],
        tried=sorted((k, v[1]) for k, v in tried.items()),
    )
