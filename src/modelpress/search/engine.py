"""``auto()``: from a model to the best deployable version within an accuracy budget.

The search runs trials (``trial.evaluate``) over the space (``space.build_space``), the likeliest
first: the original (the reference every trial is scored and timed against), then every candidate
at the optimizer's default level, then the other levels. After each of these rounds, a quantized
candidate that missed the accuracy budget but is faster than the best one within it gets layers
kept in float, the worst of its per-layer error report first: 1, 2, 4, ... layers until the budget
holds, then a bisection for the fewest. Pruning and training modes join when training data is
given.

Every trial is cached on disk as soon as it ends (``cache.TrialCache``): a search that is stopped,
by the time budget, Ctrl-C or a crash, and started again with the same inputs reuses its trials and
goes on. With labels and no separate training data, a validation part of ``data`` is held out
(``split.py``: seeded, stratified by class): every candidate is scored on it, and calibration and
the candidates that train use only the rest. The time budget stops the search from starting a trial that would end past it (judged by
the longest trial so far); the original and the first candidate always run, so a search never ends with
nothing. The result holds the Pareto front, the winner (the fastest within the budget) or, when no
candidate met the budget, the closest one found and by how much it missed.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx_ir as ir

from modelpress.errors import InputError, OptionError
from modelpress.ir import model_bytes
from modelpress.ir.feeds import as_model, load_npz
from modelpress.ir.files import write_npz
from modelpress.runtime.samples import open_samples
from modelpress.search import pareto
from modelpress.search.cache import TrialCache, bytes_digest, file_digest
from modelpress.search.metric import Scorer, eval_data
from modelpress.search.recipe import Recipe
from modelpress.search.result import AutoResult, SearchEvent
from modelpress.search.space import Candidate, Space, Step, build_space
from modelpress.search.split import VALIDATION_FRACTION, Split, holdout_split, write_parts
from modelpress.search.steps import STEPS, Context
from modelpress.search.target import Target, target_for
from modelpress.search.trial import Bench, Trial, build, evaluate

# Calibration takes the first samples of --data (at most this many, a quarter of the set at most),
# and the score the others: accuracy measured on the calibration samples flatters int8.
CALIBRATION_SAMPLES = 128
CALIBRATION_BATCH = 16


def _load_source(model) -> tuple[ir.Model, str | None, str]:

    if isinstance(model, (str, os.PathLike)):
        return as_model(model), str(model), file_digest(model)
    m = as_model(model)
    return m, None, bytes_digest(model_bytes(m))


def _load_data(
    data, folder: Path, model: ir.Model, labels_key: str | None
) -> tuple[dict[str, np.ndarray], str]:
    """The arrays of ``data`` and an .npz that holds them (the recipe's calibration source):
    anything ``runtime.samples`` reads, joined along axis 0 (labels under ``labels_key``)."""

    if isinstance(data, (str, os.PathLike)) and Path(data).suffix == ".npz":
        return load_npz(data), str(data)
    if not isinstance(data, (str, os.PathLike, dict)):
        raise OptionError(
            "`data`: give an .npz path, a folder, a .jsonl file or a dict of arrays named after "
            "the model's inputs"
        )
    samples = open_samples(data, batch_size=None, labels_key=labels_key)
    batches = list(samples.batches(model))
    try:
        arrays = {k: np.concatenate([b.feeds[k] for b in batches]) for k in batches[0].feeds}
        if labels_key and batches[0].labels is not None:
            arrays[labels_key] = np.concatenate([b.labels for b in batches])
    except (ValueError, KeyError):
        raise InputError(
            f"{samples.name}: its batches differ in shape; `auto` scores on one array per input"
        ) from None
    if isinstance(data, dict):
        arrays = {**{k: np.asarray(v) for k, v in data.items()}, **arrays}
    path = folder / "data.npz"
    write_npz(path, arrays)
    return arrays, str(path)


def _timing_feeds(arrays, names, batch: int) -> dict[str, np.ndarray]:
    feeds = {}
    for name in names:
        a = arrays[name]
        reps = -(-batch // max(len(a), 1))
        feeds[name] = np.ascontiguousarray(np.concatenate([a] * reps)[:batch])
    return feeds


class _Search:
    """The state of one search: trials so far, the clock, the cache, the best model kept."""

    def __init__(
        self,
        bench: Bench,
        cache: TrialCache,
        *,
        budget: float,
        time_budget_s: float,
        max_trials: int | None,
        max_float_layers: int | None,
        progress: Callable[[SearchEvent], None] | None,
    ):
        self.max_float_layers = max_float_layers
        self.bench, self.cache = bench, cache
        self.budget, self.time_budget_s, self.max_trials = budget, time_budget_s, max_trials
        self.progress = progress
        self.start = time.perf_counter()
        self.trials: list[Trial] = []
        self.by_key: dict[str, Trial] = {}
        self.evaluated = self.cached = 0
        self.stopped: str | None = None
        self.best: Trial | None = None
        self.best_model: ir.Model | None = None
        self.refined: set[str] = set()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def _out_of_time(self) -> bool:
        # the longest trial so far: trials differ (an entropy observer calibrates for longer) and
        # a shared machine slows them at random; a budget is a limit, not a target
        expected = max((t.seconds for t in self.trials if not t.cached), default=0.0)
        return self.elapsed() + expected > self.time_budget_s

    def run(self, candidate: Candidate, *, required: bool = False) -> Trial | None:
        """The trial of ``candidate``: from the cache, or evaluated now; None once the search
        has stopped (time budget, trial limit)."""
        key = self.cache.key(candidate)
        if key in self.by_key:
            return self.by_key[key]
        trial = self.cache.get(key)
        if trial is not None:
            trial.cached = True
            self.cached += 1
            model = None
        else:
            if self.stopped:
                return None
            if not required and self._out_of_time():
                self.stopped = f"time budget reached after {len(self.trials)} trial(s)"
                return None
            if self.max_trials is not None and self.evaluated >= self.max_trials and not required:
                self.stopped = f"trial limit reached ({self.max_trials} evaluated)"
                return None
            trial, model = evaluate(candidate, key, self.bench)
            self.cache.put(trial)
            self.evaluated += 1
        self.trials.append(trial)
        self.by_key[key] = trial
        if candidate.steps:  # the original is the reference, not a candidate
            winner, met = pareto.choose(self.candidates(), self.budget)
            if winner is trial and trial is not self.best:
                self.best = trial
                if model is not None:
                    self.best_model = model
                    self.cache.keep_model(key, model)
                else:
                    self.best_model = None
        if self.progress:
            _, met = pareto.choose(self.candidates(), self.budget)
            self.progress(
                SearchEvent(
                    "cached" if trial.cached else "trial",
                    trial,
                    len(self.trials),
                    self.elapsed(),
                    self.time_budget_s,
                    self.best,
                    met,
                )
            )
        return trial

    def candidates(self) -> list[Trial]:
        return [t for t in self.trials if t.steps]

    def refine(self) -> None:
        """Keep the worst layers of quantized candidates that missed the budget in float."""
        bases = [
            t
            for t in self.candidates()
            if t.ok
            and t.key not in self.refined
            and t.layers
            and not pareto.within(t, self.budget)
            and not any("exclude" in s.get("quantize", {}) for s in t.steps)
        ]
        for base in sorted(bases, key=lambda t: t.ratio):
            self.refined.add(base.key)
            if self.stopped:
                return
            self._refine(base)

    def _faster_than_best(self, t: Trial) -> bool:
        best, met = pareto.choose(self.candidates(), self.budget)
        return not met or best is None or t.ratio < best.ratio * (1 - pareto.TIE)

    def _refine(self, base: Trial) -> None:
        ranked = [
            layer["name"]
            for layer in sorted(
                (x for x in base.layers if x.get("quantized") and x.get("sqnr_db") is not None),
                key=lambda x: x["sqnr_db"],
            )
        ]
        if self.max_float_layers is not None:
            ranked = ranked[: self.max_float_layers + 1]  # (k stays below len(ranked))
        if not ranked or not self._faster_than_best(base):
            return
        candidate = _candidate_of(base)
        lo, hi, k = 0, None, 1
        while k < len(ranked):  # (all layers float is the float model: not worth a trial)
            t = self.run(candidate.with_exclusions(ranked[:k]))
            if t is None or not t.ok:
                return
            if pareto.within(t, self.budget):
                hi = k
                break
            if not self._faster_than_best(t):
                return  # keeping more layers float only makes it slower
            lo, k = k, k * 2
        if hi is None:
            return
        while hi - lo > 1:
            mid = (lo + hi) // 2
            t = self.run(candidate.with_exclusions(ranked[:mid]))
            if t is None or not t.ok:
                return
            if pareto.within(t, self.budget):
                hi = mid
            else:
                lo = mid


def _candidate_of(trial: Trial) -> Candidate:
    steps = []
    for s in trial.steps:
        ((kind, opts),) = s.items()
        steps.append(Step.of(kind, **opts))
    return Candidate(tuple(steps))


def auto(
    model,
    *,
    data,
    labels_key: str | None = None,
    metric: str | Callable | None = None,
    max_accuracy_drop: float = 0.01,
    target: str = "cpu",
    time_budget_s: float = 600.0,
    train_data: str | os.PathLike | None = None,
    validation_fraction: float | None = VALIDATION_FRACTION,
    split_seed: int = 0,
    train: bool = True,
    protect: dict | None = None,
    batch_size: int = 1,
    seq: int | None = None,
    calibration_samples: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    levels: list[int] | None = None,
    modes: list[str] | None = None,
    methods: list[str] | None = None,
    timing_s: float = 1.0,
    max_float_layers: int | None = None,
    max_trials: int | None = None,
    progress: Callable[[SearchEvent], None] | None = None,
) -> AutoResult:
    """Search the space for the fastest version of ``model`` within ``max_accuracy_drop``.

    ``model``: a path or an ``onnx_ir.Model``. ``data``: an .npz path (or a dict of arrays) named
    after the model's inputs, with labels under ``labels_key`` for ``metric="top1"`` (the default
    with labels; ``cosine`` without). ``target``: ``cpu`` (timed here) or a GPU of the advisor's
    catalog (estimated). ``time_budget_s``: no trial starts that would end past it.
    ``cache_dir``: where trials are kept, so a stopped search resumes (None: in memory only).
    ``levels``/``modes``/``methods`` restrict the space; ``protect`` (the protect step's options)
    adds protection after the winner; ``train_data`` lets pruning and training modes in.
    With labels and no ``train_data``, ``validation_fraction`` of ``data`` (drawn with
    ``split_seed``, stratified by class; ``split.py``) is held out to score every candidate and the
    rest calibrates and, when ``train``, trains pruned, QAT and distilled candidates; None or 0:
    no split (the first samples calibrate, the others score, nothing trains).
    ``batch_size`` and ``seq`` size the batch latency is measured (or estimated) at.
    ``max_float_layers`` bounds how many layers a quantized candidate may keep in float (0: none).
    """
    if max_accuracy_drop < 0:
        raise OptionError("`max_accuracy_drop` must be at least 0")
    if time_budget_s <= 0:
        raise OptionError("`time_budget_s` must be positive")
    if batch_size < 1:
        raise OptionError("`batch_size` must be at least 1")
    if protect is not None and "protect" not in STEPS:
        raise OptionError("`protect`: the protect layer is not installed in this modelpress")
    start = time.perf_counter()
    source, source_path, source_digest = _load_source(model)
    tmp = None
    folder = Path(cache_dir) if cache_dir is not None else None
    if folder is None:
        tmp = tempfile.TemporaryDirectory(prefix="modelpress-auto-")
        work = Path(tmp.name)
    else:
        folder.mkdir(parents=True, exist_ok=True)
        work = folder
    try:
        arrays, data_path = _load_data(data, work, source, labels_key)
        names = [v.name for v in source.graph.inputs if v.name not in source.graph.initializers]
        present = [n for n in names if n in arrays]
        if not present:
            raise InputError(
                f"{data_path}: no array named after the model's inputs ({', '.join(names)})"
            )
        n = min(arrays[k].shape[0] for k in present)
        notes: list[str] = []
        split = _split(arrays, labels_key, train_data, validation_fraction, split_seed, notes)
        if split is not None:
            kept = {k: arrays[k] for k in (*names, labels_key) if k in arrays}
            data_path, train_part = write_parts(kept, split, work / "split")
            arrays = {k: a[split.validation] for k, a in kept.items()}
            train_data = train_part if train else None
            calib_source = train_part
        else:
            calib_source = str(train_data) if train_data is not None else None
        if calib_source is not None:
            calib_n, score_from = None, 0
        else:
            calib_n = calibration_samples or max(1, min(CALIBRATION_SAMPLES, n // 4))
            score_from = calib_n if n - calib_n >= 1 else 0
        metric = metric or ("top1" if labels_key else "cosine")
        scoring = eval_data(
            arrays, names, labels_key=labels_key, start=score_from, source=data_path
        )
        scorer = Scorer(source, scoring, metric)
        tgt: Target = target_for(target)
        ctx = Context(base_dir=Path("."))
        bench = Bench.of(
            source,
            scorer,
            tgt,
            _timing_feeds(arrays, names, batch_size),
            timing_s=timing_s,
            ctx=ctx,
            seq=seq,
        )
        calib_path = calib_source or data_path
        extra = set(arrays) - set(names) - {labels_key}
        if calib_source is None and extra:
            # the quantizer takes every array of its data for an input: give it the inputs alone

            calib_path = str(work / "calibration.npz")
            write_npz(
                calib_path,
                {k: arrays[k] for k in names}
                | ({labels_key: arrays[labels_key]} if labels_key else {}),
            )
        quant = {"data": calib_path, "batch_size": CALIBRATION_BATCH}
        if calib_n is not None:
            quant["limit"] = calib_n
        if labels_key:
            quant["labels_key"] = labels_key
        train_options = (
            {"data": str(train_data), **({"labels_key": labels_key} if labels_key else {})}
            if train_data
            else None
        )
        space: Space = build_space(
            gpu=tgt.is_gpu,
            quantize_options=quant,
            levels=levels,
            modes=modes,
            methods=methods,
            train_options=train_options,
        )
        cache = TrialCache(
            folder,
            {
                "model": source_digest,
                "data": file_digest(data_path),
                "train_data": file_digest(train_data) if train_data else None,
                "calibration_data": file_digest(calib_path),
                "metric": scorer.name
                if isinstance(metric, str)
                else f"{getattr(metric, '__module__', '')}.{scorer.name}",
                "labels_key": labels_key,
                "target": tgt.name,
                "batch_size": batch_size,
                "seq": seq,
                "calibration": quant,
                "version": _version(),
            },
        )
        search = _Search(
            bench,
            cache,
            budget=max_accuracy_drop,
            time_budget_s=time_budget_s,
            max_trials=max_trials,
            max_float_layers=max_float_layers,
            progress=progress,
        )
        reference = search.run(Candidate(()), required=True)
        if reference is None or not reference.ok:
            raise InputError(
                f"the original model cannot be scored on {data_path}: {reference.error if reference else ''}"
            )
        candidates = space.candidates()
        first_level = [c for c in candidates if c.level == space.default_level]
        rest = [c for c in candidates if c.level != space.default_level]
        for i, group in enumerate((first_level, rest)):
            for c in group:
                search.run(c, required=(i == 0 and not search.candidates()))
            search.refine()
        stopped = search.stopped or "every candidate of the space was tried"
        winner, met = pareto.choose(search.candidates(), max_accuracy_drop)
        best_model = None
        if winner is not None:
            best_model = search.best_model if search.best is winner else None
            best_model = best_model or cache.kept_model(winner.key)
            if best_model is None:
                best_model, _ = build(_candidate_of(winner), source, ctx)
        steps = list(_candidate_of(winner).steps) if winner else []
        if protect is not None:
            steps.append(Step.of("protect", **protect))
        recipe = (
            Recipe(
                model=source_path,
                steps=[s.to_dict() for s in steps],
                notes=[f"chosen by modelpress auto: {winner.label if winner else 'nothing'}"],
            )
            if winner
            else None
        )
        if score_from == 0 and calib_source is None:
            notes.append(
                f"{data_path}: {n} sample(s), too few to hold out; calibrated and scored on the same samples"
            )
        result = AutoResult(
            model=best_model,
            winner=winner,
            met=met,
            max_accuracy_drop=max_accuracy_drop,
            metric=scorer.name,
            reference=reference,
            trials=search.trials,
            front=pareto.front(search.trials),
            evaluated=search.evaluated,
            cached=search.cached,
            stopped=stopped,
            target=tgt.name,
            estimated=tgt.is_gpu,
            seconds=time.perf_counter() - start,
            space=space.to_dict(),
            recipe=recipe,
            notes=notes,
            split=split.to_dict() if split is not None else None,
        )
        if progress:
            progress(
                SearchEvent(
                    "done", winner, len(search.trials), search.elapsed(), time_budget_s, winner, met
                )
            )
        return result
    finally:
        if tmp is not None:
            tmp.cleanup()


def _split(arrays, labels_key, train_data, fraction, seed, notes: list[str]) -> Split | None:
    """The validation split of labelled ``arrays`` (``split.py``), or None: no labels, training
    data given apart, no split asked for, or too few samples (said in ``notes``)."""
    if not labels_key or labels_key not in arrays or train_data is not None or not fraction:
        return None
    split = holdout_split(arrays[labels_key], fraction=fraction, seed=seed)
    if split is None:
        notes.append(
            f"{len(arrays[labels_key])} labelled sample(s): too few to hold out a validation part "
            "and train on the rest; post-training candidates only"
        )
    return split


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("modelpress")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "unknown"


__all__ = ["AutoResult", "SearchEvent", "auto"]
