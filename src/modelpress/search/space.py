"""The search space, read from what modelpress has: candidates are sequences of steps.

- optimizer levels: the levels of the registered passes (``passes.registry``), and 0 (as given);
- quantization: every mode in ``compress.quantize.MODES``, in its listing order; a mode that uses
  an observer (static) once per registered observer (``observers.OBSERVERS``), weight-only at 8
  and 4 bits, any other mode (one registered
  later) with its defaults. Half-precision float modes (a mode named after a 2-byte float
  precision of the advisor's table: fp16, bf16) are for GPU targets only: ONNX Runtime's CPU has
  few kernels for them and runs them slower than float32. Modes that train (``qat``) and pruning
  join when training data is given and their layer provides them, and so does distillation into
  a student of half the width (``DISTILL_WIDTHS``);
- per-layer float exclusions: not enumerated up front: the search adds them to a quantized
  candidate that missed the accuracy budget, taking the layers its error report ranks worst.

A ``Candidate`` is immutable and hashable; ``Candidate.spec()`` is its canonical JSON form, the
key of the trial cache and the body of a recipe.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from modelpress.compress.quantize import MODES
from modelpress.compress.quantize.modes import mode_names
from modelpress.compress.quantize.observers import OBSERVERS, get_observer
from modelpress.errors import OptionError
from modelpress.passes import optimize
from modelpress.passes.registry import REGISTRY
from modelpress.profile.training import PRECISION_BYTES
from modelpress.search.steps import STEPS

FLOAT = "float"  # the mode name of "no quantization"
# Modes that need training data, not calibration data.
TRAINING_MODES = frozenset({"qat"})
# Pruning ratios tried when training data is given (the prune step's own default is not a search).
PRUNE_RATIOS = (0.25, 0.5)
# Fewest optimizer steps (batch 32) a pruned model or a student fine-tunes for in a search (the
# training steps' ``min_train_steps``), whatever the size of the training part. Measured on
# mobilenet-digits with half the digits test split to train on (204 samples after the trainer's
# own 10%), 50% of the channels pruned: 15 steps (2 epochs) leave it 39.5 points down, 150 steps
# 3.6, 300 steps 0.9; a half-width student is 0.0 down at 300 (benchmarks/results/auto.md).
MIN_TRAIN_STEPS = 300
# Student widths distilled into when training data is given.
DISTILL_WIDTHS = (0.5,)


def _freeze(value):
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def _thaw(value):
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class Step:
    kind: str
    options: tuple[tuple[str, object], ...] = ()

    @classmethod
    def of(cls, kind: str, **options) -> Step:
        return cls(kind, tuple(sorted((k, _freeze(v)) for k, v in options.items())))

    @property
    def opts(self) -> dict:
        return {k: _thaw(v) for k, v in self.options}

    def to_dict(self) -> dict:
        return {self.kind: self.opts}


@dataclass(frozen=True)
class Candidate:
    steps: tuple[Step, ...]

    def spec(self) -> str:
        return json.dumps([s.to_dict() for s in self.steps], sort_keys=True)

    def step(self, kind: str) -> Step | None:
        return next((s for s in self.steps if s.kind == kind), None)

    @property
    def level(self) -> int:
        s = self.step("optimize")
        return int(s.opts.get("level", 2)) if s else 0

    @property
    def mode(self) -> str:
        s = self.step("quantize")
        return s.opts.get("mode", "static") if s else FLOAT

    @property
    def exclude(self) -> list[str]:
        s = self.step("quantize")
        return list(s.opts.get("exclude") or []) if s else []

    def label(self) -> str:
        if not self.steps:
            return "original"
        parts = [f"O{self.level}"]
        q = self.step("quantize")
        if q:
            o = q.opts
            detail = o.get("method") if o.get("mode", "static") == "static" else None
            if o.get("bits") and o.get("mode") == "weight-only":
                detail = f"int{o['bits']}"
            parts.append(f"{o.get('mode', 'static')}" + (f"/{detail}" if detail else ""))
            if o.get("exclude"):
                parts.append(f"{len(o['exclude'])} float")
        for s in self.steps:
            if s.kind not in ("optimize", "quantize"):
                extra = ",".join(
                    f"{k}={v}" for k, v in s.options if k in ("ratio", "sparsity", "width")
                )
                parts.append(s.kind + (f"({extra})" if extra else ""))
        return " · ".join(parts)

    def with_exclusions(self, names: list[str]) -> Candidate:
        steps = []
        for s in self.steps:
            if s.kind == "quantize":
                s = Step.of("quantize", **{**s.opts, "exclude": sorted(names)})
            steps.append(s)
        return Candidate(tuple(steps))


@dataclass(frozen=True)
class Space:
    """The dimensions of a search; ``candidates()`` lists its points in the order they are tried."""

    levels: tuple[int, ...]
    default_level: int
    modes: tuple[str, ...]  # FLOAT and quantization modes
    variants: tuple[tuple[str, tuple[dict, ...]], ...]  # mode → option sets
    quantize_options: tuple[tuple[str, object], ...]  # calibration source, shared by every mode
    prune: tuple[dict, ...] = ()
    train_options: tuple[tuple[str, object], ...] = ()
    distill: tuple[dict, ...] = ()

    def to_dict(self) -> dict:
        return {
            "levels": list(self.levels),
            "modes": list(self.modes),
            "variants": {m: [dict(v) for v in vs] for m, vs in self.variants},
            "prune": [dict(p) for p in self.prune],
            "distill": [dict(d) for d in self.distill],
        }

    def _candidate(
        self, level: int, mode: str, variant: dict, prune: dict | None = None
    ) -> Candidate:
        steps = [Step.of("optimize", level=level)] if level else []
        if mode != FLOAT:
            if mode in TRAINING_MODES:  # the quantizer reads its training data as calibration
                data = dict(self.train_options)
            else:
                data = dict(self.quantize_options)
            # the optimizer has run (or level 0 asked for the model as given)
            steps.append(Step.of("quantize", mode=mode, optimize=False, **data, **variant))
        if prune is not None:
            steps.append(Step.of("prune", **dict(self.train_options), **prune))
        return Candidate(tuple(steps))

    def candidates(self) -> list[Candidate]:
        """Every point, the likeliest first: at the optimizer's default level the float model and
        each mode's first variant; then pruning and distillation (they change the speed, where
        another observer or bit width of a mode changes only the accuracy, so they come before
        those); then the modes' other variants; then the other levels."""
        levels = [self.default_level] + [lv for lv in self.levels if lv != self.default_level]
        levels = [lv for lv in levels if lv in self.levels]
        variants = dict(self.variants)
        first: list[Candidate] = []
        later: list[Candidate] = []
        for level in levels:
            for mode in self.modes:
                for i, variant in enumerate(variants.get(mode, ({},))):
                    c = self._candidate(level, mode, dict(variant))
                    (first if level == self.default_level and i == 0 else later).append(c)
        for prune in self.prune:
            first.append(self._candidate(self.default_level, FLOAT, {}, dict(prune)))
        for distill in self.distill:
            base = self._candidate(self.default_level, FLOAT, {})
            step = Step.of("distill", **dict(self.train_options), **dict(distill))
            first.append(Candidate((*base.steps, step)))
        return list(dict.fromkeys(first + later))


def _half_float(mode: str) -> bool:

    return PRECISION_BYTES.get(mode) == 2


def _variants(mode: str, methods: list[str] | None) -> tuple[dict, ...]:

    if mode in TRAINING_MODES:
        return ({},)  # training is the costly part: once, from the mode's default start
    if getattr(MODES.get(mode), "uses_observer", False):
        names = methods if methods else list(OBSERVERS)
        for name in names:
            get_observer(name)  # an unknown name is the user's mistake: say which
        return tuple({"method": name} for name in names)
    if mode == "weight-only":
        return ({"bits": 8}, {"bits": 4})
    return ({},)


def _training_points(step: str, option: str, values: tuple) -> tuple[dict, ...]:
    """The points of a training step (``prune``, ``distill``): one a value of its ``option``,
    each with the least training the search allows; none when the step is not registered."""
    accepted = STEPS[step].options() if step in STEPS else {}
    if option not in accepted:
        return ()
    least = {"min_train_steps": MIN_TRAIN_STEPS} if "min_train_steps" in accepted else {}
    return tuple({option: v, **least} for v in values)


def build_space(
    *,
    gpu: bool,
    quantize_options: dict,
    levels: list[int] | None = None,
    modes: list[str] | None = None,
    methods: list[str] | None = None,
    train_options: dict | None = None,
) -> Space:
    """The space for a target (``gpu``: a catalog GPU, else this CPU).

    ``levels``, ``modes`` (``float`` and quantization modes) and ``methods`` (static mode's
    observers) restrict it; by default everything registered that suits the target is in it.
    ``quantize_options`` (the calibration source) go to every quantize step; ``train_options``
    (training data), when given, let training modes and pruning in.
    """
    import inspect

    known_levels = sorted({0} | {cls.level for cls in REGISTRY.values()})
    default_level = inspect.signature(optimize).parameters["level"].default
    for lv in levels or []:
        if lv not in known_levels:
            raise OptionError(
                f"`levels` {lv}: optimizer levels are {', '.join(map(str, known_levels))}"
            )
    known_modes = [FLOAT, *mode_names()]
    for m in modes or []:
        if m not in known_modes:
            raise OptionError(f"`modes` {m}: choose among {', '.join(known_modes)}")
    if modes:
        chosen_modes = list(dict.fromkeys(modes))
    else:
        chosen_modes = [
            m
            for m in known_modes
            if (gpu or not _half_float(m)) and (m not in TRAINING_MODES or train_options)
        ]
    if not train_options:
        chosen_modes = [m for m in chosen_modes if m not in TRAINING_MODES]
    chosen_levels = sorted(set(levels)) if levels else [lv for lv in known_levels if lv]
    trains = bool(train_options) and (not modes or FLOAT in modes)
    prune = _training_points("prune", "ratio", PRUNE_RATIOS) if trains else ()
    distill = _training_points("distill", "width", DISTILL_WIDTHS) if trains else ()
    return Space(
        levels=tuple(chosen_levels),
        default_level=default_level if default_level in chosen_levels else chosen_levels[0],
        modes=tuple(chosen_modes),
        variants=tuple((m, _variants(m, methods)) for m in chosen_modes if m != FLOAT),
        quantize_options=tuple(sorted(quantize_options.items())),
        prune=prune,
        train_options=tuple(sorted((train_options or {}).items())),
        distill=distill,
    )


__all__ = ["FLOAT", "Candidate", "Space", "Step", "build_space"]
