"""modelpress auto MODEL -o best.onnx --data val.npz: search for the fastest version within an
accuracy budget, write it, its recipe, and (optionally) a report page.

Try optimizer levels, quantization modes and observers, and layers kept in float (all read from
modelpress's registries); verify, score and time each candidate; keep the Pareto front (latency,
size, accuracy); write the fastest within the budget (or the closest found, saying by how much it
missed) and its recipe. Trials are cached: run the same command again to continue a stopped search.
"""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from modelpress.cli import options as opt
from modelpress.cli._common import console, human_bytes, print_notes, transient_bar
from modelpress.compress.quantize import MODES
from modelpress.errors import OptionError
from modelpress.ir import load, save
from modelpress.ir.files import output_dir, write_bytes
from modelpress.report.cards import advisor_charts
from modelpress.search import auto
from modelpress.search.metric import METRICS
from modelpress.search.split import VALIDATION_FRACTION
from modelpress.search.steps import Context, get_step
from modelpress.search.target import precision_of, target_for


def add_parser(sub) -> None:

    p = opt.add_command(
        sub,
        "auto",
        __doc__,
        help="search for the fastest version of a model within an accuracy budget",
        examples=[
            "modelpress auto cnn.onnx -o best.onnx --data val.npz --labels-key y --max-accuracy-drop 0.01",
            "modelpress auto minilm.onnx -o best.onnx --data sentences.npz --metric cosine --max-accuracy-drop 0.005 --time-budget 5m",
            "modelpress auto cnn.onnx -o best.onnx --data val.npz --target 'L4' --report report.html",
        ],
    )
    opt.add_model(p, help="an .onnx file")
    opt.add_output(p, help="where to write the chosen model")
    opt.add_data(
        p,
        required=True,
        labels=True,
        help="samples: an .npz of arrays named after the model's inputs; with --labels-key a held-out part "
        "scores and the rest calibrates and trains (--validation-fraction), without labels the first "
        "ones calibrate and the rest score",
    )
    p.add_argument(
        "--metric",
        choices=METRICS,
        help="what to keep: top1 (default with --labels-key), cosine (default without) or mse against the original's outputs",
    )
    opt.add_search_budget(
        p,
        drop="largest drop of the metric allowed (a fraction: 0.01 is one point of top-1)",
        time="stop starting trials past this (90s, 10m, 1h)",
    )
    opt.add_with_default(
        p,
        "--target",
        default="cpu",
        metavar="cpu|GPU",
        help="cpu (timed here) or a GPU of the advisor's catalog (latency estimated)",
    )
    p.add_argument(
        "--train-data",
        metavar="PATH",
        help="training samples: lets pruning and training modes into the search, and calibrates",
    )
    opt.add_with_default(
        p,
        "--validation-fraction",
        type=float,
        default=VALIDATION_FRACTION,
        metavar="F",
        help="with --labels-key and no --train-data: the part of --data held out (at random, "
        "stratified by class) to score every candidate; the rest calibrates and trains pruned, "
        "QAT and distilled candidates",
        note="0: no split, nothing trains",
    )
    opt.add_with_default(
        p, "--split-seed", type=int, default=0, metavar="N", help="seed of that split"
    )
    opt.add_switch(
        p, "--no-train", "post-training candidates only (still scored on the held-out part)"
    )
    opt.add_with_default(
        p,
        "--batch-size",
        type=int,
        default=1,
        metavar="N",
        help="batch the latency is measured (or estimated) at",
    )
    p.add_argument(
        "--seq", type=int, metavar="N", help="sequence length for the GPU estimate of a text model"
    )
    opt.add_list(p, "--levels", metavar="N", help="optimizer levels to try (default: all)")
    opt.add_list(
        p,
        "--modes",
        metavar="MODE",
        help=f"float and quantization modes to try ({', '.join(['float', *MODES])}; default: those that suit the target)",
    )
    opt.add_list(
        p,
        "--methods",
        metavar="OBSERVER",
        help="static mode's calibration observers to try (default: all)",
    )
    p.add_argument(
        "--max-float-layers",
        type=int,
        metavar="N",
        help="keep at most N layers of a quantized candidate in float (default: as many as the budget needs; 0: none)",
    )
    opt.add_with_default(
        p,
        "--timing",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="time spent timing each candidate",
    )
    p.add_argument(
        "--recipe",
        metavar="FILE.yaml",
        help="where to write the winner's recipe (default: OUTPUT with .recipe.yaml)",
    )
    p.add_argument(
        "--cache",
        metavar="DIR",
        help="where trials are kept (default: OUTPUT with .auto/ beside it)",
    )
    opt.add_switch(p, "--protect", "protect the chosen model last (needs --key-file)")
    opt.add_key(p)
    opt.add_report(p)
    opt.add_record(p)
    p.set_defaults(func=run)


def _default_paths(output: Path) -> tuple[Path, Path]:
    stem = output.name[: -len(output.suffix)] if output.suffix else output.name
    return output.with_name(stem + ".recipe.yaml"), output.with_name(stem + ".auto")


FLAGS = {
    "method": "--methods",
    "time_budget_s": "--time-budget",
}


@opt.speaks_flags(fields=FLAGS)
def run(args) -> int:

    output = Path(args.output)
    recipe_path, cache = _default_paths(output)
    recipe_path = Path(args.recipe) if args.recipe else recipe_path
    cache = Path(args.cache) if args.cache else cache
    for path in [output, recipe_path] + [Path(p) for p in (args.report, args.json) if p]:
        output_dir(path)  # before minutes of search, not after
    search = opt.search_args(args)
    budget_s = search["time_budget_s"]
    protect = None
    if args.protect:
        if not (args.key_file or args.key_env):
            raise OptionError("--protect needs --key-file or --key-env")
        protect = {k: v for k, v in (("key_file", args.key_file), ("key_env", args.key_env)) if v}
    levels = []
    for v in opt.listed(args.levels):
        if not v.isdigit():
            raise OptionError(f"--levels {v}: a level is a number (0-3)")
        levels.append(int(v))
    # (no process-wide ONNX Runtime pool here: the timing sessions do not spin between runs,
    # and a global pool would bind every later session of a process that calls main() again)
    recorder = opt.Recorder("auto", args)
    with transient_bar(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn()) as bar:
        task = bar.add_task("search", total=budget_s)

        def progress(event) -> None:
            t = event.trial
            if event.kind == "done" or t is None:
                return
            if t.ok:
                what = f"drop {max(t.drop, 0):.4g}, {t.ratio:.2f}x the original's latency"
            else:
                what = f"failed: {t.error}"
            best = f"; best {event.best.label}" if event.best else ""
            console.print(
                f"  {event.trials:>3} {'(cached) ' if event.kind == 'cached' else ''}{escape(t.label)}: {escape(what)}",
                highlight=False,
            )
            bar.update(
                task,
                completed=min(event.elapsed_s, budget_s),
                description=f"trial {event.trials}{escape(best)}",
            )

        result = auto(
            args.model,
            **search,
            **opt.keywords(
                args,
                "metric",
                "target",
                "train_data",
                "validation_fraction",
                "split_seed",
                "batch_size",
                "seq",
                "max_float_layers",
            ),
            protect=protect,
            cache_dir=cache,
            levels=levels or None,
            modes=opt.listed(args.modes) or None,
            methods=opt.listed(args.methods) or None,
            timing_s=args.timing,
            progress=progress,
        )
    _print(result)
    if result.model is None:
        raise OptionError("no candidate could be built and scored; see the failures above")
    if result.recipe is not None:
        result.recipe.output = str(output)
    save(result.model, output)
    if protect is not None:
        applied = get_step("protect").apply(result.model, dict(protect), Context())
        write_package(applied.output, output.with_suffix(".mpk"))
    result.recipe.write(recipe_path)
    console.print(
        f"wrote {escape(str(output))} and its recipe {escape(str(recipe_path))}; trials kept in {escape(str(cache))}"
    )
    if recorder.wanted:
        _record(recorder, result, load(args.model), args)
    return 0


def write_package(package, path: Path) -> None:
    """Write what a protect step made: bytes, or an object that writes itself."""

    if isinstance(package, (bytes, bytearray)):
        write_bytes(path, bytes(package))
    elif hasattr(package, "write"):
        package.write(path)
    else:
        raise OptionError(f"{path}: the protect step made nothing this command can write")
    console.print(f"wrote {escape(str(path))}")


def _record(recorder, result, original, args) -> None:

    target = target_for(args.target)
    charts, notes = advisor_charts(
        result.model,
        name=Path(args.model).stem,
        precision=precision_of(result.model),
        gpu=target.gpu,
        batch=args.batch_size,
        seq=args.seq,
    )
    data = result.to_dict()
    data["notes"] = data["notes"] + notes
    recorder.write(data, models={"original": original, "chosen": result.model}, charts=charts)


def _print(result) -> None:
    ms = "ms (est.)" if result.estimated else "ms"
    t = Table(title=f"Pareto front ({result.metric}, {result.target})", show_edge=False)
    for col in ("trial", ms, "p25-p75", "size", "drop", "within budget"):
        t.add_column(col, justify="left" if col == "trial" else "right")
    rows = [result.reference] + [x for x in result.front if x is not result.reference]
    for x in rows:
        d = result._trial(x)
        mark = " ←" if x is result.winner else ""
        t.add_row(
            escape(x.label) + mark,
            f"{d['latency_ms']:.3g}",
            f"{d.get('latency_p25_ms', 0):.3g}-{d.get('latency_p75_ms', 0):.3g}",
            human_bytes(x.size_bytes or 0),
            f"{max(x.drop, 0):.4g}",
            "yes" if d["within_budget"] else "no",
        )
    console.print(t)
    default = result.default
    if default is not None and default.ok:
        console.print(
            f"optimize + static int8 (defaults): {result.latency_ms(default):.3g} {ms}, drop {max(default.drop, 0):.4g}"
        )
    w = result.winner
    if w is None:
        return
    if result.met:
        console.print(
            f"[green]within budget[/]: {escape(w.label)}, {result.latency_ms(w):.3g} {ms} "
            f"({w.ratio:.2f}x the original), drop {max(w.drop, 0):.4g} ≤ {result.max_accuracy_drop:g}"
        )
    else:
        console.print(
            f"[red]budget not met[/]: the best found, {escape(w.label)}, drops {result.metric} by {w.drop:.4g}, "
            f"{result.shortfall:.4g} over the budget of {result.max_accuracy_drop:g}; written anyway"
        )
    console.print(
        f"{result.stopped}; {result.evaluated} trial(s) run, {result.cached} from the cache, {result.seconds:.0f} s"
    )
    print_notes(result.notes)
