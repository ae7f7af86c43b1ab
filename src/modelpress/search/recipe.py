"""Recipes: the steps from a model to its deployable version, as a YAML file anyone can replay.

    recipe: 1
    model: model.onnx            # relative paths start at the recipe's folder
    output: best.onnx
    steps:
      - optimize: {level: 2}
      - quantize: {mode: static, method: minmax, data: val.npz, limit: 112}
      - bench: {batch_size: 1}

A step is a mapping with one key, its kind (``steps.STEPS``: convert, optimize, quantize, prune,
protect, bench), whose value holds the options of that kind's library function. Validation reads
the file with its line numbers and stops at the first mistake with one line naming the file, the
line and the field (``recipe.yaml:7: steps[1].quantize.mode: 'statik' is not one of static,
dynamic, ...``). ``run_recipe`` replays the steps in order; the replay of a recipe that
``modelpress auto`` wrote builds the same model that the search chose.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import onnx_ir as ir

from modelpress.errors import InputError, ModelpressError, require
from modelpress.ir.feeds import as_model
from modelpress.ir.files import atomic
from modelpress.search.steps import FIRST, LAST, MODEL, PACKAGE, STEPS, Context, Option

VERSION = 1
TOP_LEVEL = ("recipe", "model", "output", "steps", "notes")


class RecipeError(InputError):
    """A recipe file that cannot be read or does not follow the format."""


@dataclass
class Recipe:
    steps: list[dict]
    model: str | None = None
    output: str | None = None
    notes: list[str] = field(default_factory=list)
    path: Path | None = None  # the file it was read from; relative paths start at its folder

    @property
    def base_dir(self) -> Path:
        return self.path.parent if self.path is not None else Path(".")

    def to_dict(self) -> dict:
        out: dict = {"recipe": VERSION}
        if self.model is not None:
            out["model"] = self.model
        if self.output is not None:
            out["output"] = self.output
        out["steps"] = self.steps
        if self.notes:
            out["notes"] = self.notes
        return out

    def relative_to(self, folder: str | os.PathLike) -> Recipe:
        """The same recipe with its file paths written relative to ``folder`` (where the recipe
        will be saved), so that the recipe and its files can move together."""
        folder = Path(folder).resolve()

        def rel(value: str) -> str:
            p = Path(value).resolve()
            try:
                return os.path.relpath(p, folder)
            except ValueError:  # another drive
                return str(p)

        steps = []
        for step in self.steps:
            ((kind, opts),) = step.items()
            spec = STEPS[kind].options() if kind in STEPS else {}
            opts = {
                k: (rel(v) if k in spec and spec[k].path and isinstance(v, str) else v)
                for k, v in (opts or {}).items()
            }
            steps.append({kind: opts})
        return Recipe(
            steps,
            model=rel(self.model) if self.model else None,
            output=rel(self.output) if self.output else None,
            notes=list(self.notes),
        )

    def dump(self) -> str:
        import yaml

        header = (
            "# modelpress recipe: replay with `modelpress recipe run THIS_FILE`\n"
            "# paths are relative to this file's folder\n"
        )
        return header + yaml.safe_dump(
            self.to_dict(), sort_keys=False, default_flow_style=False, allow_unicode=True
        )

    def write(self, path: str | os.PathLike) -> Path:

        p = Path(path)
        text = self.relative_to(p.parent).dump()
        with atomic(p, "w") as f:
            f.write(text)
        return p


def _require_yaml():

    return require("yaml", extra="search", purpose="recipes (YAML)")


def _lines(node, path: tuple, out: dict) -> None:
    """Line (1-based) of every value of a composed YAML tree, by its path of keys and indices."""
    import yaml

    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            out[path + (key.value,) + ("<key>",)] = key.start_mark.line + 1
            _lines(value, path + (key.value,), out)
    elif isinstance(node, yaml.SequenceNode):
        for i, value in enumerate(node.value):
            _lines(value, path + (i,), out)


class _Checker:
    def __init__(self, name: str, lines: dict):
        self.name, self.lines = name, lines

    def fail(self, path: tuple, message: str):
        line = self.lines.get(path) or self.lines.get(path[:-1]) or self.lines.get(())
        where = ""
        for p in path:
            if p != "<key>":
                where += f"[{p}]" if isinstance(p, int) else f".{p}"
        where = where.lstrip(".")
        raise RecipeError(f"{self.name}:{line}: {where + ': ' if where else ''}{message}")


def _type_ok(value, option: Option) -> bool:
    if isinstance(value, bool):
        return bool in option.types
    if isinstance(value, int) and float in option.types:
        return True
    return isinstance(value, option.types)


def _check_option(chk: _Checker, path: tuple, value, option: Option) -> None:
    if not _type_ok(value, option):
        got = "null" if value is None else type(value).__name__
        chk.fail(path, f"expected {option.describe()}, got {got} {value!r}")
    if option.choices is not None and value is not None and value not in option.choices:
        chk.fail(path, f"{value!r} is not one of {', '.join(map(str, option.choices))}")
    if option.item_choices is not None and isinstance(value, list):
        for i, item in enumerate(value):
            if item not in option.item_choices:
                chk.fail(path + (i,), f"{item!r} is not one of {', '.join(option.item_choices)}")


def _check_steps(chk: _Checker, steps) -> None:
    if not isinstance(steps, list) or not steps:
        chk.fail(("steps",), "expected a list of steps (`- optimize: {level: 2}`)")
    seen_package = False
    for i, step in enumerate(steps):
        path = ("steps", i)
        if not isinstance(step, dict) or len(step) != 1:
            chk.fail(path, f"a step is a mapping with one key, its kind ({', '.join(STEPS)})")
        ((kind, opts),) = step.items()
        if kind not in STEPS:
            chk.fail(path + (kind, "<key>"), f"unknown step {kind!r}; steps: {', '.join(STEPS)}")
        spec = STEPS[kind]
        if spec.position == FIRST and i != 0:
            chk.fail(
                path + (kind, "<key>"), f"{kind} makes the model: it can only be the first step"
            )
        if spec.position == LAST and i != len(steps) - 1:
            chk.fail(
                path + (kind, "<key>"), f"{kind} measures the result: it can only be the last step"
            )
        if spec.position == PACKAGE:
            if seen_package:
                chk.fail(path + (kind, "<key>"), f"{kind} can appear only once")
            seen_package = True
        elif spec.position == MODEL and seen_package:
            chk.fail(
                path + (kind, "<key>"),
                f"{kind} after protect: protection comes after every model step",
            )
        if opts is None:
            step[kind] = opts = {}
        if not isinstance(opts, dict):
            chk.fail(path + (kind,), "expected a mapping of options (or nothing)")
        options = spec.options()
        for name, value in opts.items():
            if name not in options:
                chk.fail(
                    path + (kind, name, "<key>"),
                    f"unknown option of {kind}; options: {', '.join(options)}",
                )
            _check_option(chk, path + (kind, name), value, options[name])


def parse_recipe(text: str, *, name: str = "recipe") -> Recipe:
    """A validated recipe from YAML text, or one ``RecipeError`` line naming the line and field."""
    yaml = _require_yaml()
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise RecipeError(f"{name}{line}: not valid YAML ({problem})") from None
    lines: dict = {}
    if node is not None:
        _lines(node, (), lines)
    chk = _Checker(name, lines)
    if not isinstance(data, dict):
        chk.fail((), "a recipe is a mapping with `steps:` (and `model:`, `output:`)")
    for key in data:
        if key not in TOP_LEVEL:
            chk.fail((key, "<key>"), f"unknown field; fields: {', '.join(TOP_LEVEL)}")
    version = data.get("recipe", VERSION)
    if version != VERSION:
        chk.fail(("recipe",), f"recipe format {version!r}: this modelpress reads format {VERSION}")
    for key in ("model", "output"):
        if data.get(key) is not None and not isinstance(data[key], str):
            chk.fail((key,), f"expected a file path, got {data[key]!r}")
    notes = data.get("notes") or []
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        chk.fail(("notes",), "expected a list of strings")
    if "steps" not in data:
        chk.fail((), "the recipe has no `steps:`")
    _check_steps(chk, data["steps"])
    return Recipe(data["steps"], model=data.get("model"), output=data.get("output"), notes=notes)


def load_recipe(path: str | os.PathLike) -> Recipe:
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise RecipeError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(
            f"{p}: cannot read the recipe ({str(exc).splitlines()[0][:120]})"
        ) from None
    recipe = parse_recipe(text, name=str(p))
    recipe.path = p
    return recipe


@dataclass
class RecipeResult:
    model: ir.Model | None  # the recipe's model (None when the last model step made a package)
    source: ir.Model | None
    steps: list[dict]  # {kind: result} per step
    package: object = None  # what a protect step made
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"steps": self.steps, "seconds": round(self.seconds, 3)}


def run_recipe(
    recipe: Recipe, *, model: str | os.PathLike | ir.Model | None = None, progress=None
) -> RecipeResult:
    """Replay ``recipe`` on its model (or ``model``): each step in order."""
    import time

    start = time.perf_counter()
    ctx = Context(base_dir=recipe.base_dir, progress=progress)
    steps = list(recipe.steps)
    current: ir.Model | None = None
    if steps and next(iter(steps[0])) == "convert":
        if model is not None:
            raise RecipeError("the recipe converts its model: give no other model")
    else:
        source = model if model is not None else recipe.model
        if source is None:
            raise RecipeError(f"{recipe.path or 'recipe'}: no `model:` to start from (or give one)")
        current = as_model(
            source if isinstance(source, ir.Model) or model is not None else ctx.path(source)
        )
    source_model = ctx.reference = current
    results, package = [], None
    for i, step in enumerate(steps):
        ((kind, opts),) = step.items()
        opts = dict(opts or {})
        try:
            applied = STEPS[kind].apply(current, opts, ctx)
        except ModelpressError as exc:
            exc.args = (f"step {i + 1} ({kind}): {exc}",)
            raise
        if i == 0 and kind == "convert":
            source_model = ctx.reference = applied.model
        if applied.output is not None:
            package = applied.output
        if applied.model is not None:
            current = applied.model
        results.append({kind: applied.result})
    return RecipeResult(current, source_model, results, package, time.perf_counter() - start)


__all__ = ["Recipe", "RecipeError", "RecipeResult", "load_recipe", "parse_recipe", "run_recipe"]
