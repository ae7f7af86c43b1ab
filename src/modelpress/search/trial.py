"""One trial: build a candidate, verify it, score it on the metric, and time (or estimate) it.

- build: the candidate's steps, in order, from the original model;
- verify: the candidate and the original run on the same scoring batches as they will be deployed
  (ONNX Runtime with its optimizations on); outputs must keep their names and shapes and be
  finite. A candidate whose outputs agree with the original's within the float tolerances of
  ``verify.TOLERANCES`` is *lossless*: its drop counts as 0 (float rounding is not a loss);
- score: the metric (``metric.Scorer``) and the drop against the original;
- latency: ``target.measure_cpu`` or ``target.estimate_gpu``; size: the serialized bytes.

A step that fails (a mode that cannot handle the model, a model ONNX Runtime refuses) makes a
failed trial with its one-line reason, not a failed search.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from modelpress.errors import ModelpressError, VerificationError
from modelpress.ir import model_bytes
from modelpress.search.metric import Scorer, runner
from modelpress.search.space import Candidate
from modelpress.search.steps import Context, get_step
from modelpress.search.target import Latency, Target, estimate_gpu, measure_cpu
from modelpress.verify import compare_arrays


@dataclass
class Trial:
    key: str
    label: str
    steps: list[dict]
    status: str  # "ok" or "failed"
    error: str | None = None
    score: float | None = None
    drop: float | None = None
    lossless: bool = False
    max_rel: float | None = None  # largest relative output difference from the original
    latency: dict | None = None  # Latency.to_dict()
    size_bytes: int | None = None
    seconds: float = 0.0  # to build and evaluate
    layers: list[dict] = field(default_factory=list)  # the quantizer's per-layer error report
    passes: list[dict] = field(default_factory=list)  # the optimizer's passes that changed it
    notes: list[str] = field(default_factory=list)
    cached: bool = False  # read from the cache in this search, not evaluated

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def ratio(self) -> float | None:
        return None if not self.latency else self.latency["ratio"]

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict) -> Trial:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def build(candidate: Candidate, source: ir.Model, ctx: Context) -> tuple[ir.Model, list[dict]]:
    """The candidate's model and each step's result (``{kind: result}``)."""
    model = source
    results = []
    for step in candidate.steps:
        applied = get_step(step.kind).apply(model, step.opts, ctx)
        if applied.model is not None:
            model = applied.model
        results.append({step.kind: applied.result})
    return model, results


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def _layers(results: list[dict]) -> list[dict]:
    for r in results:
        q = r.get("quantize")
        if q:
            return [
                {k: layer.get(k) for k in ("name", "op_type", "quantized", "sqnr_db", "rel_error")}
                for layer in q.get("layers", [])
            ]
    return []


def _passes(results: list[dict]) -> list[dict]:
    return [
        {"pass": p["name"], "rewrites": p["rewrites"]}
        for r in results
        for p in (r.get("optimize") or {}).get("passes", [])
        if p.get("rewrites")
    ]


def _notes(results: list[dict]) -> list[str]:
    notes = [n for r in results for v in r.values() for n in (v.get("notes") or [])]
    # the quantizer's own check (what the quantize command would refuse to write): the search
    # measures and scores the candidate itself, and says what the check found
    for r in results:
        check = (r.get("quantize") or {}).get("check") or {}
        notes += [f"quantize check: {f}" for f in check.get("failures") or []]
    return notes


def _verify(source_out: list[dict], run, batches) -> tuple[bool, float]:
    """(lossless, largest relative difference); raises ModelpressError when outputs lost their
    names or shapes or are not finite."""

    lossless, worst = True, 0.0
    for feeds, ref in zip(batches, source_out):
        got = run(feeds)
        for name, a in ref.items():
            if name not in got:
                raise VerificationError(f"the candidate has no output {name!r}")
            b = np.asarray(got[name])
            if b.shape != np.asarray(a).shape:
                raise VerificationError(
                    f"output {name!r} has shape {list(b.shape)}, the original {list(np.shape(a))}"
                )
            if b.dtype.kind == "f" and not np.isfinite(b).all():
                raise VerificationError(f"output {name!r} has NaN or infinite values")
            # compared in the original's type: a float16 model's outputs are rounded to float16
            diff = compare_arrays(name, a, b.astype(np.asarray(a).dtype))
            lossless &= diff.passed
            worst = max(worst, diff.max_rel)
    return lossless, worst


@dataclass
class Bench:
    """What every trial of a search shares: the original, the data, the metric, the target."""

    source: ir.Model
    scorer: Scorer
    verify_batches: list[dict[str, np.ndarray]]
    source_outputs: list[dict[str, np.ndarray]]
    target: Target
    feeds: dict[str, np.ndarray]  # the batch latency is measured on
    timing_s: float
    ctx: Context
    reference_ms: float | None = None  # the original's estimate (GPU targets)
    seq: int | None = None

    @classmethod
    def of(cls, source, scorer, target, feeds, *, timing_s, ctx, seq=None) -> Bench:
        batches = scorer.data.batches[:2]
        run = runner(source)
        bench = cls(
            source,
            scorer,
            batches,
            [run(b) for b in batches],
            target,
            feeds,
            timing_s,
            ctx,
            seq=seq,
        )
        if target.gpu is not None:
            bench.reference_ms = estimate_gpu(
                source, None, target.gpu, batch=bench.batch, seq=seq
            ).median_ms
        return bench

    @property
    def batch(self) -> int:
        return int(next(iter(self.feeds.values())).shape[0]) if self.feeds else 1

    def latency(self, model: ir.Model) -> Latency:
        if self.target.gpu is not None:
            return estimate_gpu(
                model, self.reference_ms, self.target.gpu, batch=self.batch, seq=self.seq
            )
        return measure_cpu(model, self.source, self.feeds, seconds=self.timing_s)


def evaluate(
    candidate: Candidate, key: str, bench: Bench, *, keep: Callable[[ir.Model], None] | None = None
) -> tuple[Trial, ir.Model | None]:
    """The trial of ``candidate`` and its model (None when it failed)."""

    start = time.perf_counter()
    trial = Trial(key, candidate.label(), [s.to_dict() for s in candidate.steps], "ok")
    model = None
    try:
        model, results = build(candidate, bench.source, bench.ctx)
        trial.layers = _layers(results)
        trial.passes = _passes(results)
        trial.notes = _notes(results)
        run = runner(model)
        trial.lossless, trial.max_rel = _verify(bench.source_outputs, run, bench.verify_batches)
        trial.score = bench.scorer.score(run)
        trial.drop = 0.0 if trial.lossless else bench.scorer.drop(trial.score)
        trial.size_bytes = len(model_bytes(model))
        trial.latency = bench.latency(model).to_dict()
    except ModelpressError as exc:
        trial.status, trial.error, model = "failed", _first_line(exc), None
    except Exception as exc:  # noqa: BLE001 - a mode meeting a graph it was not written for
        # one candidate failing is a result of the search, not the end of it
        trial.status, trial.error, model = (
            "failed",
            f"{type(exc).__name__}: {_first_line(exc)}",
            None,
        )
    trial.seconds = time.perf_counter() - start
    if model is not None and keep is not None:
        keep(model)
    return trial, model


__all__ = ["Bench", "Trial", "build", "evaluate"]
