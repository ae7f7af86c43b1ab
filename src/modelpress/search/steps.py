"""The steps that a search candidate and a recipe are made of: registered kinds, like the passes.

A step kind is a ``StepKind`` subclass registered with ``@register_step``: its ``name``, where it
stands in a recipe (``position``: ``convert`` first, the model steps ``optimize``, ``quantize``,
``prune`` in any order, ``protect`` after every model step, ``bench`` last), a one-line
``summary``, the library function it runs (``function``, ``"module:name"``, imported on first use:
pruning needs the torch extra, which a search or recipe without a prune step must not load), and
``apply(model, opts, ctx)``. Its options are that function's keyword-only parameters whose type
JSON or YAML can write (bool, int, float, str, lists and mappings of them), so an option added to
``quantize()`` can be written in a recipe without a change here; ``overrides`` gives some of them
their choices from a registry (quantization modes, observers, passes). Options that name files are
resolved against the folder of the recipe. What a step needs besides the model and its options
(the recipe's folder, the model the recipe started from) is in the ``Context``.
"""

from __future__ import annotations

import importlib
import inspect
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import onnx_ir as ir

from modelpress.compress.quantize.modes import mode_names
from modelpress.compress.quantize.observers import ALIASES, OBSERVERS
from modelpress.errors import OptionError
from modelpress.ir.feeds import load_npz
from modelpress.ir.graph import copy_model
from modelpress.passes.registry import REGISTRY
from modelpress.runtime.measure import compare_latency
from modelpress.verify import generate_inputs

# Where a kind may stand: convert first, then model steps, protect, bench.
FIRST, MODEL, PACKAGE, LAST = 0, 1, 2, 3
# Options that name a file: resolved against the recipe's folder.
PATH_OPTIONS = frozenset(
    {"calibration", "data", "train_data", "source", "key_file", "student", "teacher"}
)
JSON_TYPES = (bool, int, float, str, list, dict, type(None))


@dataclass(frozen=True)
class Option:
    """One option of a step: the JSON types it accepts and, where a registry has them, its choices."""

    name: str
    types: tuple[type, ...]
    default: object = None
    choices: tuple | None = None
    item_choices: tuple[str, ...] | None = None  # for a list of names (passes, layers)
    path: bool = False

    def describe(self) -> str:
        names = sorted({t.__name__ if t is not type(None) else "null" for t in self.types})
        return " or ".join(names)


@dataclass
class Context:
    """What a step needs besides the model: the folder relative paths start from."""

    base_dir: Path = Path(".")
    progress: Callable[[int, int | None], None] | None = None
    reference: ir.Model | None = None  # the model the recipe started from (bench compares)

    def path(self, value: str | os.PathLike) -> str:
        p = Path(value).expanduser()
        return str(p if p.is_absolute() else self.base_dir / p)


@dataclass
class Applied:
    """What a step did: the model it made (None for steps that only measure) and its result."""

    model: ir.Model | None
    result: dict = field(default_factory=dict)
    output: object = None  # a step that writes something other than a model (a package)


class StepKind:
    """A kind of step (see the module docstring). Subclass it, set the class attributes,
    implement ``apply``, and decorate the class with ``@register_step``."""

    name: str = ""
    position: int = MODEL  # FIRST, MODEL, PACKAGE or LAST
    summary: str = ""
    function: str = ""  # "module:name" of the library function the step runs
    skip: tuple[str, ...] = ("progress",)  # its parameters that are not recipe options

    def run(self) -> Callable:
        """The library function, imported on first use."""
        module, _, name = self.function.partition(":")
        return getattr(importlib.import_module(module), name)

    def overrides(self) -> dict[str, Option]:
        """Options whose choices come from a registry (or whose types the signature does not say)."""
        return {}

    def options(self) -> dict[str, Option]:
        return options_of(self.run(), skip=self.skip, overrides=self.overrides())

    def resolve(self, opts: dict, ctx: Context) -> dict:
        """``opts`` with the options that name files resolved against the recipe's folder."""
        spec = self.options()
        return {
            k: (ctx.path(v) if k in spec and spec[k].path and isinstance(v, str) else v)
            for k, v in opts.items()
        }

    def apply(self, model: ir.Model | None, opts: dict, ctx: Context) -> Applied:
        """Run the library function on ``model`` with ``opts``; a model step returns the model it
        made, a package step what it wrote (``Applied.output``)."""
        result = self.run()(model, **self.resolve(opts, ctx))
        if self.position == PACKAGE:
            return Applied(model, _to_dict(result), output=result)
        made = getattr(result, "model", None)
        return Applied(made if made is not None else result, _to_dict(result))


STEPS: dict[str, StepKind] = {}


def register_step(cls: type[StepKind]) -> type[StepKind]:
    """Class decorator: one instance of the kind under ``cls.name`` (any later layer may add its
    own kinds)."""
    assert cls.name and cls.name not in STEPS, f"duplicate or empty step kind {cls.name!r}"
    STEPS[cls.name] = cls()
    return cls


def get_step(name: str) -> StepKind:
    if name not in STEPS:
        raise OptionError(f"unknown step {name!r}; steps: {', '.join(STEPS)}")
    return STEPS[name]


def _json_types(hint) -> tuple[type, ...] | None:
    """The JSON types a parameter's annotation admits, or None when it admits something else too
    (a model, a callable, a dataclass): such parameters are not recipe options."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        found: list[type] = []
        for arg in typing.get_args(hint):
            sub = _json_types(arg)
            if sub is None:
                return None
            found += sub
        return tuple(dict.fromkeys(found))
    if hint is type(None):
        return (type(None),)
    if hint in (bool, int, str):
        return (hint,)
    if hint is float:
        return (float, int)
    if origin in (list, tuple, typing.Sequence, typing.Iterable) or hint in (list, tuple):
        args = typing.get_args(hint)
        if args and any(_json_types(a) is None for a in args if a is not Ellipsis):
            return None
        return (list,)
    if origin in (dict, typing.Mapping) or hint is dict:
        return (dict,)
    if origin is typing.Literal:
        return tuple(dict.fromkeys(type(a) for a in typing.get_args(hint)))
    if hint in (os.PathLike,) or (isinstance(hint, type) and issubclass(hint, os.PathLike)):
        return (str,)
    return None


def options_of(
    fn: Callable, *, skip: tuple[str, ...] = (), overrides: dict[str, Option] | None = None
) -> dict[str, Option]:
    """The recipe options of ``fn``: its keyword-only parameters with JSON-writable types
    (``overrides`` gives some of them choices from a registry)."""
    overrides = overrides or {}
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - an annotation that cannot be evaluated: use the defaults
        hints = {}
    out: dict[str, Option] = {}
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind is not inspect.Parameter.KEYWORD_ONLY or name in skip:
            continue
        if name in overrides:
            out[name] = overrides[name]
            continue
        accepted = _json_types(hints[name]) if name in hints else None
        if accepted is None and name not in hints and param.default is not inspect.Parameter.empty:
            accepted = (type(param.default),) if isinstance(param.default, JSON_TYPES) else None
        if accepted is None:
            continue
        if name in PATH_OPTIONS:
            accepted = tuple(dict.fromkeys((*accepted, str)))
        default = None if param.default is inspect.Parameter.empty else param.default
        out[name] = Option(name, accepted, default, path=name in PATH_OPTIONS)
    return out


# --- built-in kinds ---------------------------------------------------------------------------


@register_step
class ConvertStep(StepKind):
    name = "convert"
    position = FIRST
    summary = "framework model → ONNX, verified"
    function = "modelpress.convert:convert"
    skip = ("output", "example_inputs")

    def overrides(self) -> dict[str, Option]:
        return {"source": Option("source", (str,), path=True)}

    def options(self) -> dict[str, Option]:
        return {**self.overrides(), **options_of(self.run(), skip=self.skip)}

    def apply(self, model, opts, ctx: Context) -> Applied:
        opts = self.resolve(opts, ctx)
        source = opts.pop("source", None)
        if source is None:
            raise OptionError("convert: the step needs 'source' (the framework model to convert)")
        result = self.run()(source, **opts)
        return Applied(result.model, _to_dict(result))


@register_step
class OptimizeStep(StepKind):
    name = "optimize"
    summary = "graph rewrites"
    function = "modelpress.passes:optimize"

    def overrides(self) -> dict[str, Option]:
        names = tuple(REGISTRY)
        return {
            "level": Option("level", (int,), 2, choices=(0, 1, 2, 3)),
            "passes": Option("passes", (list, type(None)), item_choices=names),
            "skip": Option("skip", (list, type(None)), item_choices=names),
        }

    def apply(self, model, opts, ctx: Context) -> Applied:
        result = self.run()(copy_model(model), **opts)
        return Applied(result.model, result.to_dict())


@register_step
class QuantizeStep(StepKind):
    name = "quantize"
    summary = "post-training quantization"
    function = "modelpress.compress.quantize:quantize"

    def overrides(self) -> dict[str, Option]:
        return {
            "mode": Option("mode", (str,), "static", choices=tuple(mode_names())),
            "method": Option("method", (str,), "minmax", choices=(*OBSERVERS, *ALIASES)),
            "exclude": Option("exclude", (list, type(None))),
            "data": Option("data", (str, type(None)), path=True),
        }

    def apply(self, model, opts, ctx: Context) -> Applied:
        result = self.run()(model, progress=ctx.progress, **self.resolve(opts, ctx))
        return Applied(result.model, result.to_dict())


class TrainingStep(StepKind):
    """A step that trains. ``min_train_steps`` (a recipe option) makes it train for at least
    that many optimizer steps: the library's default is counted in epochs, which on a small
    training set is a handful of updates (pruning's 2 epochs are 15 steps on 227 samples), too
    few to recover what pruning or a narrower student lost. Otherwise the library's own
    training (``defaults``) as it is."""

    defaults: str = ""  # "module:NAME" of the library's default TrainConfig

    def options(self) -> dict[str, Option]:
        least = Option("min_train_steps", (int, type(None)))
        return {**super().options(), "min_train_steps": least}

    def apply(self, model, opts, ctx: Context) -> Applied:
        opts = dict(opts)
        least = opts.pop("min_train_steps", None)
        if least:
            data = self.resolve(opts, ctx).get("data")
            opts["train"] = _at_least(self.defaults, least, data, opts.get("limit"))
        return super().apply(model, opts, ctx)


def _at_least(defaults: str, least: int, data, limit: int | None):
    """The library's default training, run for at least ``least`` steps on ``data``."""
    from dataclasses import replace

    module, _, name = defaults.partition(":")
    config = getattr(importlib.import_module(module), name)
    n = 0
    if isinstance(data, (str, os.PathLike)):
        n = max((len(a) for a in load_npz(data).values() if a.ndim), default=0)
    n = min(n, limit) if limit else n
    per_epoch = -(-int(n * (1 - config.val_fraction)) // config.batch_size)
    return replace(config, steps=max(least, (config.epochs or 1) * per_epoch))


@register_step
class PruneStep(TrainingStep):
    name = "prune"
    summary = "pruning with fine-tuning"
    function = "modelpress.compress.prune.api:prune"
    defaults = "modelpress.compress.prune.api:DEFAULT_TRAINING"


@register_step
class DistillStep(TrainingStep):
    name = "distill"
    summary = "distillation into a narrower student"
    function = "modelpress.compress.distill.api:distill"
    defaults = "modelpress.compress.distill.api:DEFAULT_TRAINING"


@register_step
class ProtectStep(StepKind):
    name = "protect"
    position = PACKAGE
    summary = "encryption and obfuscation"
    function = "modelpress.protect:protect"


@register_step
class BenchStep(StepKind):
    """Latency of the recipe's result against the model it started from (``ctx.reference``),
    interleaved on this machine's CPU."""

    name = "bench"
    position = LAST
    summary = "latency against the source model"

    def options(self) -> dict[str, Option]:
        return {
            "batch_size": Option("batch_size", (int,), 1),
            "seconds": Option("seconds", (float, int), 2.0),
            "data": Option("data", (str, type(None)), path=True),
        }

    def apply(self, model, opts, ctx: Context) -> Applied:
        opts = self.resolve(opts, ctx)
        reference = ctx.reference
        batch = int(opts.get("batch_size", 1))
        if batch < 1:
            raise OptionError("bench: 'batch_size' must be at least 1")
        feeds = _bench_feeds(model, opts.get("data"), batch) or generate_inputs(
            model, dims={"batch": batch}
        )
        models = [reference, model] if reference is not None else [model]
        timings = compare_latency(models, feeds, budget_s=float(opts.get("seconds", 2.0)))
        out = {"batch_size": batch, "result": timings[-1].to_dict()}
        if reference is not None:
            out["source"] = timings[0].to_dict()
            out["ratio"] = timings[1].median_ms / max(timings[0].median_ms, 1e-12)
        return Applied(None, out)


def _bench_feeds(model: ir.Model, data: str | None, batch: int):
    if not data:
        return None

    arrays = load_npz(data)
    names = {v.name for v in model.graph.inputs}
    return {k: v[:batch] for k, v in arrays.items() if k in names}


def _to_dict(result) -> dict:
    return result.to_dict() if hasattr(result, "to_dict") else {}


__all__ = [
    "STEPS",
    "Applied",
    "Context",
    "Option",
    "StepKind",
    "get_step",
    "options_of",
    "register_step",
]
