"""modelpress demo -o DIR: the whole flow on a model modelpress builds itself, step by step.

Train a small ResNet-style CNN on scikit-learn's digits, convert it from PyTorch to ONNX, inspect,
optimize, verify and time it, and print the before/after table.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.table import Table

from modelpress.cli import options
from modelpress.cli._common import (
    console,
    heading,
    human_bytes,
    human_count,
    print_notes,
    write_json,
)
from modelpress.cli.convert_cmd import print_verify_table
from modelpress.demo import STEPS, DemoState
from modelpress.errors import OptionError

# The steps live in ``modelpress.demo`` (they return data); this module prints them, one printer
# per step name.


def add_parser(sub) -> None:
    p = options.add_command(
        sub,
        "demo",
        __doc__,
        help="run the whole flow on a small CNN it trains itself",
        examples=["modelpress demo -o demo_out"],
    )
    p.add_argument(
        "-o",
        "--output",
        default="demo_out",
        help="folder for the models and summary.json (created if missing; default demo_out)",
    )
    options.add_with_default(
        p, "--runs", type=int, default=200, metavar="N", help="timed runs per model, interleaved"
    )
    options.add_record(p)
    p.set_defaults(func=run)


def _ms(s) -> str:
    return f"{s.median_ms:.3f} ms ({s.p25_ms:.3f}–{s.p75_ms:.3f})"


def _print_build(r) -> None:
    console.print(f"{r.name}: {r.description}")
    console.print(
        f"{human_count(r.parameters)} parameters, trained on {r.train_images} images in {r.seconds:.1f} s; "
        f"PyTorch test accuracy {r.torch_accuracy:.2%} on {r.test_images} images"
    )


def _print_convert(r) -> None:

    console.print(f"exporter {r.exporter}, {r.nodes_converted} nodes, wrote {r.output}")
    print_notes(r.notes)
    print_verify_table(f"ONNX Runtime vs PyTorch ({r.verify.runs} input sets)", r.verify)


def _print_inspect(r) -> None:
    s = r.stats
    console.print(
        f"opsets {s.opsets}, nodes {s.node_count}, parameters {human_count(s.parameters)} "
        f"({human_bytes(s.parameter_bytes)}), FLOPs per image {human_count(r.flops)}"
    )
    console.print("ops: " + ", ".join(f"{op} {n}" for op, n in s.op_counts.items()))


def _print_optimize(r) -> None:
    console.print(
        f"nodes {r.nodes_before} → {r.nodes_after} in {r.seconds * 1e3:.0f} ms; rewrites: "
        + (", ".join(f"{k} {v}" for k, v in r.rewrites.items()) or "none")
    )
    console.print(
        f"verified against the converted model: {'[green]PASS[/]' if r.verify.passed else '[red]FAIL[/]'} "
        f"(max rel {r.verify.max_rel:.2g}, {r.verify.runs} input sets)"
    )


def _print_quantize(r) -> None:
    err = "?" if r.output_error is None else f"{r.output_error:.3g}"
    console.print(
        f"{r.mode}: {human_bytes(r.size_before)} → {human_bytes(r.size_after)} "
        f"({r.size_after / r.size_before:.2f}×) in {r.seconds:.1f} s; output error vs float (relative) {err}"
    )
    print_notes(r.notes)


def _print_protect(r) -> None:
    m = r.metrics
    console.print(
        f"wrote {r.path.name} ({human_bytes(r.bytes)}, AES-256-GCM) in {r.seconds:.1f} s; opened in memory "
        f"and run on 64 test images: max relative difference {r.max_rel:.2g} from the int8 model"
    )
    console.print(
        f"from the file alone: {m.anonymous_share:.0%} of {m.compute_nodes} compute nodes anonymous, "
        f"{m.original_nodes} → {m.nodes} nodes, largest weight correlation with the original "
        f"{m.max_weight_correlation:.3f}, original names found: {len(m.names_found)}"
    )


def _print_advise(r) -> None:
    plan = r.plan
    t = Table(
        title=f"{plan.qps:,.0f} requests/s at p99 ≤ {plan.p99_ms:g} ms, int8, dynamic batching",
        show_edge=False,
    )
    for col in (
        "#",
        "device",
        "n",
        "batch",
        "p99 ms",
        "$/M rent",
        "$/M own",
        "max batch",
        "delay ms",
    ):
        t.add_column(col, justify="left" if col == "device" else "right")
    money = lambda v: "-" if v is None else f"${v:.4f}"  # noqa: E731
    for o in plan.options:
        t.add_row(
            str(o.rank),
            o.device.replace("NVIDIA ", ""),
            str(o.replicas),
            f"{o.queue.mean_batch:.1f}",
            f"{o.queue.p99_ms:.2f}",
            money(o.cloud_usd_per_million),
            money(o.own_usd_per_million),
            str(o.max_batch),
            f"{o.max_delay_ms:g}",
        )
    console.print(t)
    console.print(
        "n: replicas; batch: the mean batch the server forms; serve with `modelpress serve --max-batch --max-delay-ms`"
    )
    for device, reason in plan.rejected:
        console.print(f"not an option: {device}: {reason}")


def _print_transformer(r) -> None:
    lat = r.latency
    console.print(
        f"{r.name}: {human_bytes(r.size_before)} → {human_bytes(r.size_after)} "
        f"({r.size_after / r.size_before:.2f}×); int8 vs float32 outputs: mean cosine {r.cosine:.4f}"
    )
    console.print(
        "batch 8 × 128 tokens (padded), ORT all optimizations: "
        + ", ".join(f"{k} {_ms(v)}" for k, v in lat.items())
        + f"; int8 {lat['int8'].median_ms / lat['float32'].median_ms:.2f}× float32"
    )
    print_notes(r.notes)


def _print_latency(r) -> None:
    for level, by_label in r.items():
        console.print(
            f"ORT optimizations {level}: " + ", ".join(f"{k} {_ms(v)}" for k, v in by_label.items())
        )


def _print_evaluate(r) -> None:
    console.print(", ".join(f"{k} {v:.2%}" for k, v in r.items()))


def _print_summary(rows) -> None:
    t = Table(title="before / after", show_edge=False)
    for col in (
        "model",
        "nodes",
        "size",
        "ms, ORT opt off",
        "ms, ORT opt all",
        "accuracy",
        "verified",
    ):
        t.add_column(col, justify="left" if col == "model" else "right")
    for r in rows:
        t.add_row(
            r.label,
            str(r.nodes),
            human_bytes(r.size_bytes),
            f"{r.latency['disabled'].median_ms:.3f}" if "disabled" in r.latency else "-",
            f"{r.latency['all'].median_ms:.3f}" if "all" in r.latency else "-",
            f"{r.accuracy:.2%}",
            "[green]yes[/]" if r.verified else "[red]no[/]",
        )
    console.print(t)
    console.print("latency: median of interleaved single-image runs, one thread")


def _print_decoder(r) -> None:
    console.print(
        f"{r.family}, {r.layers} layers (random weights): converted with its KV cache, logits "
        f"within {r.max_logit_diff:.1e} of transformers; float {human_bytes(r.float_bytes)} → "
        f"int4 {human_bytes(r.int4_bytes)}"
    )
    console.print(f"prompt {r.prompt!r}: float {r.float_text!r}")
    console.print(
        f"int4 {r.int4_text!r} ({r.tokens_per_s:.0f} tokens/s); next-token agreement with float "
        f"along its greedy path {r.top1_agreement:.0%} (random weights: near-ties everywhere)"
    )
    console.print(f"served (POST /v1/chat/completions): {r.chat_answer!r}")
    print_notes(r.notes)


PRINTERS = {
    "build": _print_build,
    "convert": _print_convert,
    "inspect": _print_inspect,
    "optimize": _print_optimize,
    "quantize": _print_quantize,
    "protect": _print_protect,
    "advise": _print_advise,
    "latency": _print_latency,
    "evaluate": _print_evaluate,
    "summary": _print_summary,
    "transformer": _print_transformer,
    "decoder": _print_decoder,
}


def run(args) -> int:

    options.require_positive(args.runs, "--runs")
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise OptionError(f"--output {out}: exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    state = DemoState(out_dir=out, latency_runs=args.runs)
    recorder = options.Recorder("demo", args)
    start = time.perf_counter()
    record = {}
    results = {}
    for i, step in enumerate(STEPS, 1):
        heading(f"[bold]{i}. {step.title}")
        t0 = time.perf_counter()
        results[step.name] = result = step.run(state)
        PRINTERS[step.name](result)
        record[step.name] = round(time.perf_counter() - t0, 3)
    console.print(f"done in {time.perf_counter() - start:.0f} s; models in {out}/")
    summary = {
        "seconds_per_step": record,
        "models": {
            label: {
                "path": str(state.paths[label]),
                "verified": state.verified.get(label, False),
                "accuracy": state.accuracy.get(label),
                "latency_ms": {lvl: by[label].median_ms for lvl, by in state.latency.items()},
            }
            for label in state.models
        },
    }
    prot = results.get("protect")
    if prot is not None:
        summary["protect"] = {
            "path": str(prot.path),
            "max_rel": prot.max_rel,
            "metrics": prot.metrics.to_dict(),
        }
    adv = results.get("advise")
    if adv is not None:
        summary["service"] = adv.plan.to_dict()
    dec = results.get("decoder")
    if dec is not None:
        summary["decoder"] = {
            "float_bytes": dec.float_bytes,
            "int4_bytes": dec.int4_bytes,
            "max_logit_diff": dec.max_logit_diff,
            "top1_agreement": dec.top1_agreement,
            "chat_answer": dec.chat_answer,
        }
    tr = results.get("transformer")
    if tr is not None:
        summary["transformer"] = {
            "model": tr.name,
            "size_ratio": tr.size_after / tr.size_before,
            "cosine": tr.cosine,
            "latency_ms": {k: v.median_ms for k, v in tr.latency.items()},
        }
    write_json(out / "summary.json", summary)
    recorder.write(summary)
    return 0
