"""The report page: records of any commands turned into one self-contained HTML file.

One section per record, in the order given: the model cards (inputs, outputs, ops, parameters,
FLOPs, memory), then what the command did, by command (``RENDERERS``: what each pass changed, the
per-layer quantization error, latency with its spread, the search's Pareto front with the chosen
point, the advisor's ranking), then what any record may carry: a training loss curve, the roofline
of the model's kernels and the advisor's cost chart. A command with no renderer still gets its
cards and a table of its result's plain fields. The page has no script and loads nothing: the
charts are inline SVG whose text is drawn as paths.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

from modelpress.errors import InputError
from modelpress.report import plots
from modelpress.report.advisor_plots import costs_figure, roofline_figure
from modelpress.report.html import Page, Section
from modelpress.report.record import Record
from modelpress.report.train_plots import loss_curve


def _mib(n) -> str:
    if n is None:
        return "-"
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f} B"


def _count(n) -> str:
    if n is None:
        return "-"
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return f"{n:.0f}"


def _shape(v: dict) -> str:
    return "?" if v.get("shape") is None else "[" + ", ".join(map(str, v["shape"])) + "]"


def model_cards(s: Section, models: dict) -> None:
    if not models:
        return
    roles = list(models)
    rows = []
    for field, fmt in (
        ("nodes", str),
        ("parameters", _count),
        ("parameter_bytes", _mib),
        ("file_bytes", _mib),
        ("flops", _count),
        ("bytes_moved", _mib),
        ("largest_activation_bytes", _mib),
    ):
        label = {
            "parameter_bytes": "weights",
            "file_bytes": "file size",
            "flops": "FLOPs per run (batch 1)",
            "bytes_moved": "bytes moved per run (at least)",
            "largest_activation_bytes": "largest activation",
        }.get(field, field)
        rows.append(
            [label]
            + [
                fmt(models[r].get(field)) if models[r].get(field) is not None else "-"
                for r in roles
            ]
        )
    s.table(["model card"] + roles, rows)
    first = models[roles[0]]
    io = [["input", v["name"], v.get("dtype", "?"), _shape(v)] for v in first.get("inputs", [])]
    io += [["output", v["name"], v.get("dtype", "?"), _shape(v)] for v in first.get("outputs", [])]
    if io:
        s.table(["", "name", "dtype", "shape"], io)
    dims = first.get("dims_set_to_1")
    if dims:
        s.text(f"dynamic dimensions set to 1 for FLOPs: {', '.join(dims)}", note=True)
    ops = [m.get("op_counts", {}) for m in models.values()]
    names = sorted(set().union(*ops), key=lambda o: -max(c.get(o, 0) for c in ops))
    s.table(["op"] + roles, [[o] + [c.get(o, 0) for c in ops] for o in names[:20]])
    if len(names) > 20:
        s.text(f"{len(names) - 20} more op types", note=True)
    if len(roles) >= 2 and ops[0] != ops[-1]:
        s.figure(plots.op_counts_figure(ops[0], ops[-1]), caption=f"{roles[0]} → {roles[-1]}")


def _passes_table(s: Section, passes: list[dict]) -> None:
    rows = [
        [
            p.get("name") or p.get("pass"),
            p.get("rewrites", 0),
            round(1e3 * p["seconds"], 2) if "seconds" in p else "-",
        ]
        for p in passes
        if p.get("rewrites")
    ]
    if rows:
        s.table(["pass", "rewrites", "ms"], rows)
    else:
        s.text("no pass changed the model")


def _optimize(s: Section, r: dict, record: Record) -> None:
    s.text(
        f"level {r.get('level', '?')}: {r.get('rewrites', 0)} rewrite(s) in {r.get('rounds', '?')} round(s)"
        + (f"; nodes {r['nodes_before']} → {r['nodes_after']}" if "nodes_before" in r else "")
    )
    _passes_table(s, r.get("passes", []))
    v = r.get("verify")
    if v:
        worst = max((o.get("max_rel", 0) for o in v.get("outputs", [])), default=0)
        s.text(
            f"verified against the input: {'passed' if v.get('passed') else 'FAILED'} (max relative difference {worst:.3g})"
        )


def _quantize(s: Section, r: dict, record: Record) -> None:
    s.text(
        f"mode {r.get('mode')}"
        + (f", observer {r['method']}" if r.get("method") else "")
        + f": {_mib(r.get('size_before'))} → {_mib(r.get('size_after'))}"
        + (
            f", output error {r['output_error']:.3g} (relative)"
            if r.get("output_error") is not None
            else ""
        )
    )
    acc = r.get("accuracy")
    rows = []
    # (the quantizer's check times float against the result when asked: check.latency)
    lat = r.get("latency_ms") or r.get("latency") or (r.get("check") or {}).get("latency")
    if isinstance(lat, dict) and "float" in lat and "quantized" in lat:
        rows = [
            dict(
                label="float",
                **_timing(lat["float"]),
                score=acc.get("metric_float") if acc else None,
            ),
            dict(
                label="quantized",
                **_timing(lat["quantized"]),
                score=acc.get("metric_quantized") if acc else None,
                chosen=True,
            ),
        ]
        s.figure(
            plots.before_after_figure(
                rows,
                metric="metric" if acc else "(no metric)",
                latency_note="ONNX Runtime on this CPU",
            )
        )
    if acc:
        s.text(
            f"metric {acc.get('metric_float', 0):.4g} → {acc.get('metric_quantized', 0):.4g} "
            f"(drop {acc.get('drop', 0):.4g}, budget {acc.get('budget')}): {'met' if acc.get('met') else 'not met'}; "
            f"kept in float: {', '.join(acc.get('kept_float') or []) or 'none'}"
        )
    layers = r.get("layers") or []
    if layers:
        s.figure(
            plots.layer_errors_figure(layers),
            caption="each quantized layer's output against the float model's",
        )
    for note in r.get("notes") or []:
        s.text(f"note: {note}", note=True)


def _timing(t: dict) -> dict:
    return {
        "median_ms": t["median_ms"],
        "p25_ms": t.get("p25_ms", t["median_ms"]),
        "p75_ms": t.get("p75_ms", t["median_ms"]),
    }


def _bench(s: Section, r: dict, record: Record) -> None:
    models = r.get("models") or []
    # the first model is the one the others are compared with (grey), as in the command's table
    rows = [
        dict(label=Path(str(m.get("model", "?"))).name, **_timing(m["timing"]), score=None)
        for m in models
        if m.get("timing")
    ]
    if rows:
        s.figure(
            plots.before_after_figure(
                rows,
                metric="(not measured)",
                latency_note=f"batch {r.get('batch', '?')}, {r.get('backend', '')}",
            )
        )
        s.table(
            ["model", "median ms", "p25 ms", "p75 ms", "runs", "GFLOP/s"],
            [
                [
                    Path(str(m.get("model"))).name,
                    m["timing"]["median_ms"],
                    m["timing"].get("p25_ms"),
                    m["timing"].get("p75_ms"),
                    m["timing"].get("runs"),
                    m.get("gflops", "-"),
                ]
                for m in models
                if m.get("timing")
            ],
        )


def _advise(s: Section, r: dict, record: Record) -> None:
    devices = r.get("devices") or []
    rows = []
    for d in devices:
        e, c = d.get("estimate") or d, d.get("cost") or d
        rows.append(
            [
                d.get("rank") or "-",
                d.get("gpu", "?"),
                e.get("batch", "-"),
                e.get("throughput", "-"),
                e.get("latency_ms", "-"),
                e.get("bound", "-"),
                c.get("cloud_usd_per_million", "-"),
                d.get("reason", ""),
            ]
        )
    if rows:
        s.table(
            ["#", "gpu", "batch", "throughput", "latency ms", "bound", "$/M cloud", "reason"],
            rows[:15],
        )


def _auto(s: Section, r: dict, record: Record) -> None:
    win, ref, default = r.get("winner"), r.get("reference") or {}, r.get("default")
    budget = r.get("max_accuracy_drop", 0)
    if win:
        verdict = (
            f"within the budget: {r['metric']} drop {max(win['drop'], 0):.4g} ≤ {budget:g}"
            if r.get("met")
            else f"budget NOT met: the best found drops {r['metric']} by {win['drop']:.4g}, {r.get('shortfall', 0):.4g} over the budget of {budget:g}"
        )
        s.text(
            f"chosen: {win['label']}; {verdict}. {r.get('stopped', '')}; {r.get('evaluated', 0)} trial(s) run, {r.get('cached', 0)} from the cache."
        )
    est = r.get("estimated")
    note = (
        f"estimated by the advisor for {r.get('target')}"
        if est
        else "ONNX Runtime on this CPU, interleaved with the original"
    )
    rows = []
    for label, t in (
        ("original", ref),
        ("optimize + static int8 (defaults)", default),
        ("chosen: " + (win or {}).get("label", ""), win),
    ):
        if t and t.get("latency_ms") is not None:
            rows.append(
                {
                    "label": label,
                    "median_ms": t["latency_ms"],
                    "p25_ms": t.get("latency_p25_ms", t["latency_ms"]),
                    "p75_ms": t.get("latency_p75_ms", t["latency_ms"]),
                    "score": t.get("score"),
                    "chosen": t is win,
                }
            )
    if rows:
        s.figure(
            plots.before_after_figure(rows, metric=r.get("metric", "metric"), latency_note=note),
            caption="before and after",
        )
    trials = r.get("trials") or []
    if trials:
        s.figure(
            plots.pareto_figure(
                trials,
                chosen=(win or {}).get("key"),
                budget=budget,
                metric=r.get("metric", "metric"),
                estimated=bool(est),
            ),
            caption="every trial; the Pareto front (latency, size, drop) joined; the chosen one starred",
        )
        s.table(
            ["trial", "status", "latency ms", "size", "drop", "within budget", "front", "cached"],
            [
                [
                    t["label"],
                    t["status"] if t["status"] == "ok" else f"failed: {t.get('error')}",
                    t.get("latency_ms") if t.get("latency_ms") is not None else "-",
                    _mib(t.get("size_bytes")),
                    t["drop"] if t.get("drop") is not None else "-",
                    "yes" if t.get("within_budget") else "no",
                    "yes" if t.get("on_front") else "",
                    "yes" if t.get("cached") else "",
                ]
                for t in trials
            ],
        )
    if win and win.get("passes"):
        s.text("what the optimizer changed in the chosen model:")
        _passes_table(s, win["passes"])
    if win and win.get("layers"):
        s.figure(
            plots.layer_errors_figure(
                win["layers"], title="per-layer quantization error of the chosen model"
            )
        )
    recipe = r.get("recipe")
    if recipe:
        steps = ", ".join(next(iter(st)) for st in recipe.get("steps", []))
        s.text(f"recipe: {steps} (replay with `modelpress recipe run`)")
    for n in r.get("notes") or []:
        s.text(f"note: {n}", note=True)


def _deploy(s: Section, r: dict, record: Record) -> None:
    """``modelpress deploy``: the plan (every option), the server's cost, the files and the check."""
    service, chosen = r.get("service") or {}, r.get("chosen") or {}
    cost = r.get("server_cost") or {}
    s.text(
        f"{r.get('qps', '?')} requests/s at p99 {r.get('p99_ms', '?')} ms; deployed: "
        f"{chosen.get('replicas', '?')} x {chosen.get('device', '?')} ({chosen.get('serve_args', '')}), "
        f"promised p99 {_num(chosen.get('p99_ms'))} ms. The server's own cost, measured here: "
        f"{_num(cost.get('per_request_ms'))} ms per request + {_num(cost.get('per_kb_ms'))} ms per KB, "
        f"p99 spread {_num(cost.get('tail_ms'))} ms."
    )
    options = service.get("options") or []
    if options:
        s.table(
            ["#", "device", "replicas", "max batch", "delay ms", "p50 ms", "p99 ms", "$/M cloud"],
            [
                [
                    o.get("rank"),
                    o.get("device"),
                    o.get("replicas"),
                    o.get("max_batch"),
                    o.get("max_delay_ms"),
                    o.get("p50_ms"),
                    o.get("p99_ms"),
                    o.get("cloud_usd_per_million")
                    if o.get("cloud_usd_per_million") is not None
                    else "-",
                ]
                for o in options
            ],
        )
    for rej in service.get("rejected") or []:
        s.text(f"not an option: {rej.get('device')}: {rej.get('reason')}", note=True)
    check = r.get("check")
    if check:
        p99 = check.get("measured_p99_ms")
        s.table(
            [
                "checked",
                "rate /s",
                "promised p99 ms",
                "measured p99 ms",
                "p50 ms",
                "answered /s",
                "verdict",
            ],
            [
                [
                    check.get("device"),
                    check.get("rate"),
                    check.get("promised_p99_ms"),
                    p99 if p99 is not None else "-",
                    check.get("measured_p50_ms"),
                    check.get("measured_throughput"),
                    "missed" if check.get("missed") else "held",
                ]
            ],
        )
        s.text(check.get("reason", ""), note=True)
    files = r.get("files") or []
    if files:
        s.table(
            ["file", "read by", "status"],
            [[f.get("file"), f.get("tool"), f.get("status")] for f in files],
        )
    for n in r.get("notes") or []:
        s.text(f"note: {n}", note=True)


def _num(v) -> str:
    return f"{v:.3g}" if isinstance(v, (int, float)) else "?"


def _recipe(s: Section, r: dict, record: Record) -> None:
    for step in r.get("steps", []):
        ((kind, res),) = step.items()
        if kind == "optimize":
            s.text("optimize:")
            _passes_table(s, (res or {}).get("passes", []))
        elif kind == "quantize":
            _quantize(s, res or {}, record)
        elif kind == "bench" and res:
            rows = []
            if res.get("source"):
                rows.append(dict(label="source", **_timing(res["source"]), score=None))
            rows.append(
                dict(label="recipe's result", **_timing(res["result"]), score=None, chosen=True)
            )
            s.figure(
                plots.before_after_figure(
                    rows, metric="(not measured)", latency_note=f"batch {res.get('batch_size')}"
                )
            )


RENDERERS: dict[str, Callable[[Section, dict, Record], None]] = {
    "optimize": _optimize,
    "quantize": _quantize,
    "bench": _bench,
    "advise": _advise,
    "auto": _auto,
    "deploy": _deploy,
    "recipe": _recipe,
}


def find_loss_curves(result: dict) -> dict[str, list[tuple[float, float]]]:
    """The loss curve(s) of a result: ``loss_curve`` (or ``history``) anywhere in it, as
    ``{series: [values]}``, ``{series: [[step, value], ...]}`` or ``[{"step": s, "loss": v, ...}]``."""
    found = None
    stack = [result]
    while stack and found is None:
        obj = stack.pop()
        if isinstance(obj, dict):
            for key in ("loss_curve", "history"):
                if key in obj and isinstance(obj[key], (dict, list)):
                    found = obj[key]
                    break
            stack += [v for v in obj.values() if isinstance(v, (dict, list))]
        elif isinstance(obj, list):
            stack += [v for v in obj if isinstance(v, (dict, list))]
    curves: dict[str, list[tuple[float, float]]] = {}
    if isinstance(found, dict):
        for name, values in found.items():
            if isinstance(values, list):
                pts = [
                    (float(v[0]), float(v[1]))
                    if isinstance(v, (list, tuple))
                    else (float(i), float(v))
                    for i, v in enumerate(values)
                    if v is not None
                ]
                curves[name] = [p for p in pts if math.isfinite(p[1])]
    elif isinstance(found, list):
        for i, row in enumerate(found):
            if not isinstance(row, dict):
                continue
            step = float(row.get("step", row.get("epoch", i)))
            for name, v in row.items():
                if (
                    name not in ("step", "epoch")
                    and isinstance(v, (int, float))
                    and math.isfinite(v)
                ):
                    curves.setdefault(name, []).append((step, float(v)))
    return {k: v for k, v in curves.items() if v}


def _plain_fields(s: Section, result: dict) -> None:
    rows = [
        [k, str(v) if isinstance(v, bool) else v]
        for k, v in result.items()
        if isinstance(v, (int, float, str))
    ]
    if rows:
        s.table(["field", "value"], rows[:30])


def _title(record: Record) -> str:
    model = record.options.get("model") or record.options.get("recipe") or ""
    return f"{record.command} {Path(str(model)).name}".strip()


def build_page(records: list[Record], *, title: str = "modelpress report") -> Page:
    page = Page(title)
    s = page.section("Runs")
    s.table(
        ["#", "command", "model", "started", "seconds", "modelpress", "machine"],
        [
            [
                i + 1,
                r.command,
                str(r.options.get("model") or "-"),
                r.started or "-",
                r.seconds,
                r.version or "-",
                f"{r.machine.get('cpu', '?')}, {r.machine.get('cores', '?')} cores",
            ]
            for i, r in enumerate(records)
        ],
    )
    for i, record in enumerate(records):
        s = page.section(f"{i + 1}. {_title(record)}")
        model_cards(s, record.models)
        renderer = RENDERERS.get(record.command)
        if renderer is not None:
            renderer(s, record.result, record)
        else:
            _plain_fields(s, record.result)
        trained = loss_curve(record.result)  # prune, distill, compress, quantize --mode qat
        if trained is not None:
            s.figure(trained, caption="training loss per optimizer step (train and held out)")
        curves = find_loss_curves(record.result)
        if curves:
            s.figure(plots.loss_figure(curves), caption="loss per step")
        roof = record.charts.get("roofline")
        if roof:
            s.figure(
                roofline_figure(roof),
                caption="each point is a kernel of the model at its predicted speed (advisor)",
            )
        costs = record.charts.get("costs")
        if costs and costs.get("devices"):
            s.figure(
                costs_figure(costs), caption="the advisor's devices: up and to the left is better"
            )
    return page


def write_report(
    records: list[Record], path: str | os.PathLike, *, title: str = "modelpress report"
) -> Path:
    """Write the page of ``records`` to ``path`` (atomically)."""
    return build_page(records, title=title).write(path)


def read_records(paths: list[str | os.PathLike]) -> list[Record]:
    """Records from files and folders (every ``*.json`` inside, sorted); one ``InputError`` line
    for the first bad file."""

    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("*.json"))
            if not found:
                raise InputError(f"{p}: no .json records in this folder")
            files += found
        else:
            files.append(p)
    if not files:
        raise InputError("no records given")
    return [Record.read(f) for f in files]


__all__ = [
    "RENDERERS",
    "build_page",
    "find_loss_curves",
    "model_cards",
    "read_records",
    "write_report",
]
