"""The steps that a search candidate and a recipe are made of, looked up by name.

A step kind wraps one library function (``optimize``, ``quantize``, ...). The options it accepts are
read from that function's keyword-only parameters whose type JSON or YAML can write (bool, int,
float, str, lists and mappings of them), so an option added to ``quantize()`` can be written in a
recipe without a change here; choices (quantization modes, observers, passes) come from their
registries. Options that name files are resolved against the folder of the recipe.

The kinds stand in this order in a recipe: ``convert`` (first, makes the model), the model steps
(``optimize``, ``quantize``, ``prune``, in any order), ``protect`` (after every model step) and
``bench`` (last). ``prune`` and ``protect`` import their layer on first use
(``modelpress.compress.prune.api.prune``, ``modelpress.protect.protect``); any later layer may
``register_step`` its own.
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

from modelpress.compress.quantize import quantize
from modelpress.compress.quantize.modes import mode_names
from modelpress.compress.quantize.observers import ALIASES, OBSERVERS
from modelpress.convert import convert
from modelpress.errors import OptionError
from modelpress.ir.feeds import load_npz
from modelpress.ir.graph import copy_model
from modelpress.passes import optimize
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

    def path(self, value: str | os.PathLike) -> str:
        p = Path(value).expanduser()
        return str(p if p.is_absolute() else self.base_dir / p)


@dataclass
class Applied:
    """What a step did: the model it made (None for steps that only measure) and its result."""

    model: ir.Model | None
    result: dict = field(default_factory=dict)
    output: object = None  # a step that writes something other than a model (a package)


@dataclass(frozen=True)
class StepKind:
    name: str
    position: int  # FIRST, MODEL, PACKAGE or LAST
    options: Callable[[], dict[str, Option]]
    apply: Callable[[ir.Model | None, dict, Context], Applied]
    summary: str = ""


STEPS: dict[str, StepKind] = {}


def register_step(kind: StepKind) -> StepKind:
    assert kind.name not in STEPS, f"duplicate step kind {kind.name!r}"
    STEPS[kind.name] = kind
    return kind


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


def _resolve_paths(opts: dict, kind: StepKind, ctx: Context) -> dict:
    spec = kind.options()
    return {
        k: (ctx.path(v) if k in spec and spec[k].path and isinstance(v, str) else v)
        for k, v in opts.items()
    }


# --- built-in kinds ---------------------------------------------------------------------------


def _convert_options() -> dict[str, Option]:

    opts = options_of(convert, skip=("output", "example_inputs"))
    return {"source": Option("source", (str,), path=True), **opts}


def _convert(model, opts, ctx: Context) -> Applied:

    opts = _resolve_paths(opts, STEPS["convert"], ctx)
    source = opts.pop("source", None)
    if source is None:
        raise OptionError("convert: the step needs 'source' (the framework model to convert)")
    result = convert(source, **opts)
    return Applied(result.model, _to_dict(result))


def _optimize_options() -> dict[str, Option]:

    names = tuple(REGISTRY)
    return options_of(
        optimize,
        overrides={
            "level": Option("level", (int,), 2, choices=(0, 1, 2, 3)),
            "passes": Option("passes", (list, type(None)), item_choices=names),
            "skip": Option("skip", (list, type(None)), item_choices=names),
        },
    )


def _optimize(model, opts, ctx: Context) -> Applied:

    result = optimize(copy_model(model), **opts)
    return Applied(result.model, result.to_dict())


def _quantize_options() -> dict[str, Option]:

    return options_of(
        quantize,
        skip=("progress",),
        overrides={
            "mode": Option("mode", (str,), "static", choices=tuple(mode_names())),
            "method": Option("method", (str,), "minmax", choices=(*OBSERVERS, *ALIASES)),
            "exclude": Option("exclude", (list, type(None))),
            "data": Option("data", (str, type(None)), path=True),
        },
    )


def _quantize(model, opts, ctx: Context) -> Applied:

    opts = _resolve_paths(opts, STEPS["quantize"], ctx)
    result = quantize(model, progress=ctx.progress, **opts)
    return Applied(result.model, result.to_dict())


def _bench_options() -> dict[str, Option]:
    return {
        "batch_size": Option("batch_size", (int,), 1),
        "seconds": Option("seconds", (float, int), 2.0),
        "data": Option("data", (str, type(None)), path=True),
    }


def _bench(model, opts, ctx: Context) -> Applied:
    """Latency of the recipe's result against the model it started from (the runner passes the
    source model in ``opts['_reference']``), interleaved on this machine's CPU."""

    opts = _resolve_paths(opts, STEPS["bench"], ctx)
    reference = opts.pop("_reference", None)
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


register_step(
    StepKind("convert", FIRST, _convert_options, _convert, "framework model → ONNX, verified")
)
register_step(StepKind("optimize", MODEL, _optimize_options, _optimize, "graph rewrites"))
register_step(
    StepKind("quantize", MODEL, _quantize_options, _quantize, "post-training quantization")
)


def _lazy(name: str, module: str, function: str, position: int, summary: str) -> None:
    """Register a kind whose function is imported when the kind is first used: pruning needs the
    torch extra, which a search or recipe without a prune step must not load."""

    def fn():
        return getattr(importlib.import_module(module), function)

    def options() -> dict[str, Option]:
        return options_of(fn(), skip=("progress",))

    def apply(model, opts, ctx: Context) -> Applied:
        result = fn()(model, **_resolve_paths(opts, STEPS[name], ctx))
        made = getattr(result, "model", None)
        if position == PACKAGE:
            return Applied(model, _to_dict(result), output=result)
        return Applied(made if made is not None else result, _to_dict(result))

    register_step(StepKind(name, position, options, apply, summary))


_lazy("prune", "modelpress.compress.prune.api", "prune", MODEL, "pruning with fine-tuning")
_lazy("protect", "modelpress.protect", "protect", PACKAGE, "encryption and obfuscation")
register_step(StepKind("bench", LAST, _bench_options, _bench, "latency against the source model"))

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
