"""modelpress recipe run RECIPE.yaml: replay a recipe (convert → optimize → quantize → prune →
protect → bench); modelpress recipe check RECIPE.yaml: validate one.

Replay a recipe's steps on its model, or check a recipe without running it.
"""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape

from modelpress.cli import options as opt
from modelpress.cli._common import console, human_bytes
from modelpress.cli.auto_cmd import write_package
from modelpress.errors import OptionError
from modelpress.ir import model_bytes, save
from modelpress.ir.files import output_dir
from modelpress.search.recipe import load_recipe, run_recipe
from modelpress.search.steps import STEPS


def add_parser(sub) -> None:

    p = opt.add_command(
        sub,
        "recipe",
        __doc__,
        help="replay or check a recipe (the steps `auto` chose, as YAML)",
        epilog="steps: " + ", ".join(f"{k} ({v.summary})" for k, v in STEPS.items()) + "\n\n"
        "examples:\n"
        "  modelpress recipe run best.recipe.yaml\n"
        "  modelpress recipe run best.recipe.yaml other.onnx -o other-best.onnx\n"
        "  modelpress recipe check my.yaml",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    r = actions.add_parser("run", help="replay a recipe")
    r.add_argument("recipe", metavar="RECIPE", help="a recipe .yaml file")
    r.add_argument(
        "model",
        nargs="?",
        metavar="MODEL",
        help="start from this model instead of the recipe's `model:`",
    )
    opt.add_output(
        r, required=False, help="where to write the result (default: the recipe's `output:`)"
    )
    opt.add_report(r)
    opt.add_record(r)
    r.set_defaults(func=run)
    c = actions.add_parser("check", help="validate a recipe without running it")
    c.add_argument("recipe", metavar="RECIPE", help="a recipe .yaml file")
    opt.add_record(c)
    c.set_defaults(func=check)


def check(args) -> int:

    recipe = load_recipe(args.recipe)
    console.print(
        f"{escape(args.recipe)}: {len(recipe.steps)} step(s): {', '.join(next(iter(s)) for s in recipe.steps)}"
    )
    opt.Recorder("recipe", args).write({"valid": True, "recipe": recipe.to_dict()})
    return 0


def run(args) -> int:

    recipe = load_recipe(args.recipe)
    output = args.output or (recipe.base_dir / recipe.output if recipe.output else None)
    if output is None:
        raise OptionError("the recipe has no `output:`: give -o FILE")
    output = Path(output)
    for path in [output] + [Path(p) for p in (args.report, args.json) if p]:
        output_dir(path)
    recorder = opt.Recorder("recipe", args)
    result = run_recipe(recipe, model=args.model)
    for step in result.steps:
        ((kind, res),) = step.items()
        console.print(f"{kind}: {escape(_summary(kind, res))}")
    if result.model is not None:
        save(result.model, output)

        console.print(
            f"wrote {escape(str(output))} ({human_bytes(len(model_bytes(result.model)))}) in {result.seconds:.1f} s"
        )
    if result.package is not None:
        write_package(result.package, output.with_suffix(".mpk"))
    recorder.write(result.to_dict(), models={"source": result.source, "result": result.model})
    return 0


def _summary(kind: str, res: dict) -> str:
    if kind == "optimize":
        return f"level {res.get('level')}, {res.get('rewrites', 0)} rewrite(s)"
    if kind == "quantize":
        return f"{res.get('mode')}, {res.get('size_before', 0)} → {res.get('size_after', 0)} bytes"
    if kind == "bench":
        r = res.get("result", {})
        ratio = f", {res['ratio']:.2f}x the source" if "ratio" in res else ""
        return f"{r.get('median_ms', 0):.3g} ms median (p25-p75 {r.get('p25_ms', 0):.3g}-{r.get('p75_ms', 0):.3g}) at batch {res.get('batch_size')}{ratio}"
    return ", ".join(f"{k}={v}" for k, v in res.items() if isinstance(v, (int, float, str)))[:200]
