"""modelpress prune MODEL -o OUT: structured (channels, heads, neurons removed) or unstructured
(2:4, magnitude) pruning, fine-tuned on the data given.

Prune a model: structured pruning finds the channels that must go together on the ONNX graph
(residuals, concat, depthwise convs, attention heads) and removes them, so the model is smaller and
faster; unstructured pruning zeroes weights. Then fine-tunes on the data, with its labels or
against the original model.
"""

from __future__ import annotations

from rich.table import Table

from modelpress.cli import options
from modelpress.cli._common import console, human_bytes, human_count, print_notes
from modelpress.cli._training import training_run, write_checked
from modelpress.compress.prune import calibration as calib
from modelpress.compress.prune.importance import METHODS
from modelpress.compress.prune.unstructured import PATTERNS
from modelpress.ir import save
from modelpress.runtime.measure import compare_latency
from modelpress.verify import generate_inputs


def add_parser(sub) -> None:
    p = options.add_command(
        sub,
        "prune",
        __doc__,
        help="prune channels, heads and neurons (physically) or weights (2:4, magnitude), then fine-tune",
        examples=[
            "modelpress prune cnn.onnx -o small.onnx --data train.npz --labels-key y --ratio 0.5",
            "modelpress prune cnn.onnx -o small.onnx --data images/ --ratio 0.5 --rounds 3",
            "modelpress prune bert.onnx -o small.onnx --data text.npz --ratio 0.5 --head-ratio 0.33",
            "modelpress prune cnn.onnx -o sparse.onnx --data train.npz --pattern 2:4",
        ],
    )
    options.add_model(p)
    options.add_key(p)
    options.add_output(p)
    options.add_training_data(p)
    what = p.add_argument_group("what to prune")
    what.add_argument(
        "--ratio",
        type=float,
        metavar="X",
        help="structured: fraction of each group's channels/neurons to remove",
    )
    what.add_argument(
        "--head-ratio",
        type=float,
        metavar="X",
        help="structured: fraction of attention heads to remove (default: --ratio)",
    )
    what.add_argument(
        "--sparsity", type=float, metavar="X", help="unstructured: fraction of weights set to zero"
    )
    options.add_with_default(
        what,
        "--pattern",
        default=PATTERNS[0],
        choices=PATTERNS,
        help="unstructured: 2:4 keeps 2 of every 4 weights, for sparse tensor cores",
    )
    options.add_scope(what, help="unstructured: one threshold for all layers (global) or per layer")
    what.add_argument(
        "--importance",
        default="activation",
        choices=METHODS + calib.METHODS,
        help="structured: what ranks channels, neurons and heads (default activation: the weights that read them times their size on the data); fisher and obs measure neurons and heads",
    )
    options.add_switch(
        what,
        "--refit",
        "structured: refit the layers that read removed neurons and heads by least squares on the data",
    )
    options.add_with_default(
        what,
        "--rounds",
        type=int,
        default=1,
        metavar="N",
        help="structured: prune in N rounds, fine-tuning after each",
    )
    options.add_list(what, "--exclude", metavar="NODE", help="layers that stay whole")
    options.add_with_default(
        what,
        "--round-to",
        type=int,
        default=1,
        metavar="N",
        help="structured: keep a multiple of N channels per group",
    )
    options.add_switch(
        what,
        "--global-ranking",
        "structured: rank the units of each kind across all groups (the ratio of the total, at most 90%% of one group) instead of a ratio per group",
    )
    options.add_switch(p, "--no-latency", "skip the before/after latency check on this CPU")
    options.add_training(p)
    options.add_record(p)
    p.set_defaults(func=run)


# The options of "what to prune" that ``prune`` takes as they are (--exclude is its ``keep``).
WHAT = (
    "ratio",
    "head_ratio",
    "sparsity",
    "pattern",
    "scope",
    "importance",
    "rounds",
    "round_to",
    "global_ranking",
    "refit",
)


@options.speaks_flags
def run(args) -> int:
    from modelpress.compress.prune.api import prune

    options.require_positive(args.rounds, "--rounds")
    with training_run("prune", args) as (recorder, model, progress):
        result = prune(
            model,
            **options.keywords(args, *WHAT),
            keep=options.listed(args.exclude),
            progress=progress,
            **options.training_args(args, train=None if args.data else False),
        )
    if result.rounds:
        _print_groups(result.rounds[-1]["groups"], result.rounds)
    print_notes(result.notes)
    latency = None if args.no_latency else _latency(model, result.model, args)
    sparsity = f", sparsity {result.sparsity:.1%}" if result.sparsity is not None else ""
    console.print(
        f"{result.kind}: parameters {human_count(result.params_before)} → {human_count(result.params_after)}, "
        f"size {human_bytes(result.size_before)} → {human_bytes(result.size_after)}{sparsity}"
    )
    record = {**result.to_dict(), "latency": latency}
    return write_checked(
        args, result, result.training, record, recorder, lambda: save(result.model, args.output)
    )


def _print_groups(groups: list[dict], rounds: list[dict]) -> None:
    t = Table(title="dependency groups", show_edge=False)
    t.add_column("#", justify="right")
    t.add_column("kind")
    t.add_column("units", justify="right")
    t.add_column("removed", justify="right")
    t.add_column("layers that write them")
    for i, g in enumerate(groups):
        removed = g["removed"] if g["prunable"] else "blocked"
        src = ", ".join(g["sources"][:3]) + (
            f" (+{len(g['sources']) - 3})" if len(g["sources"]) > 3 else ""
        )
        t.add_row(str(i), g["kind"], str(g["units"]), str(removed), src)
    console.print(t)
    total = sum(r["removed_units"] for r in rounds)
    console.print(
        f"removed {total} units in {len(rounds)} round(s), {human_count(sum(r['removed_params'] for r in rounds))} parameters"
    )


def _latency(before, after, args) -> dict | None:
    """ONNX Runtime CPU latency of both models at batch 8 on generated inputs."""

    try:
        feeds = generate_inputs(before, dims={d: 8 for d in _batch_dims(before)}, seed=0)
        a, b = compare_latency([before, after], feeds, budget_s=1.5)
    except Exception as exc:  # noqa: BLE001 - a check, not the command's work
        console.print(f"note: latency not measured ({str(exc).splitlines()[0][:120]})")
        return None
    console.print(
        f"latency (ONNX Runtime, this CPU, batch 8): {a.median_ms:.3f} ms → {b.median_ms:.3f} ms ({b.median_ms / a.median_ms:.2f}x)"
    )
    return {"batch": 8, "before_ms": a.median_ms, "after_ms": b.median_ms}


def _batch_dims(model) -> list[str]:
    names = []
    for v in model.graph.inputs:
        if v.shape is not None and len(v.shape) and not isinstance(v.shape[0], int):
            names.append(str(v.shape[0]))
    return names
