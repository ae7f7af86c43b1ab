"""Charts of the report, drawn from the plain data of records (matplotlib, the ``report`` extra).

Each chart is readable on paper: values are written on the bars, the chosen point is labelled, the
axes say their units. Spreads are the 25th-75th percentiles of the timed runs.
"""

from __future__ import annotations

import math

from modelpress.report.html import label_points, new_figure

# Colours of the report: the original, the chosen model, everything else.
ORIGINAL, CHOSEN, OTHER, FAILED = "#6b7280", "#d97706", "#2563eb", "#dc2626"


def layer_errors_figure(layers: list[dict], *, title: str = "per-layer quantization error"):
    """SQNR in dB of each layer's output (higher is better), layers kept float in grey."""
    rows = [x for x in layers if x.get("sqnr_db") is not None or not x.get("quantized", True)]
    height = min(max(2.0, 0.22 * len(rows) + 1.2), 30.0)
    fig, ax = new_figure(7.0, height)
    names = [x["name"] for x in rows]
    finite = [
        x["sqnr_db"] for x in rows if x.get("sqnr_db") is not None and math.isfinite(x["sqnr_db"])
    ]
    cap = max(finite, default=60.0) * 1.1 or 60.0
    values, colours = [], []
    for x in rows:
        v = x.get("sqnr_db")
        if not x.get("quantized", True) or v is None:
            values.append(0.0)
            colours.append(ORIGINAL)
        else:
            values.append(cap if v == math.inf else max(v, 0.0))
            colours.append(OTHER)
    y = list(range(len(rows)))
    ax.barh(y, values, color=colours)
    for i, x in enumerate(rows):
        v = x.get("sqnr_db")
        text = (
            "kept float"
            if not x.get("quantized", True)
            else ("exact" if v == math.inf else f"{v:.1f} dB")
        )
        ax.text(values[i], i, " " + text, va="center", fontsize=7)
    ax.set_yticks(y)
    ax.set_yticklabels(names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, cap * 1.25)
    ax.set_xlabel("SQNR of the layer's output, dB (higher is better; 20 dB ≈ 10% error)")
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)
    return fig


def before_after_figure(rows: list[dict], *, metric: str, latency_note: str = ""):
    """Latency (median with p25-p75) and the metric of each model, side by side.

    ``rows``: ``{"label", "median_ms", "p25_ms", "p75_ms", "score", "chosen"}`` (score may be None).
    """
    scores = [r.get("score") for r in rows]
    known = [s for s in scores if s is not None and math.isfinite(s)]
    height = max(2.2, 0.5 * len(rows) + 1.2)
    if known:
        fig, (lat, acc) = new_figure(9.0, height, ncols=2)
    else:  # timings alone (bench): no empty accuracy panel
        fig, lat = new_figure(6.0, height)
        acc = None
    y = list(range(len(rows)))
    colours = [
        CHOSEN if r.get("chosen") else (ORIGINAL if i == 0 else OTHER) for i, r in enumerate(rows)
    ]
    med = [r["median_ms"] for r in rows]
    lo = [r["median_ms"] - r.get("p25_ms", r["median_ms"]) for r in rows]
    hi = [r.get("p75_ms", r["median_ms"]) - r["median_ms"] for r in rows]
    lat.barh(y, med, xerr=[lo, hi], color=colours, capsize=3)
    for i, m in enumerate(med):
        lat.text(m + hi[i], i, f"  {m:.3g} ms", va="center", fontsize=7)
    lat.set_yticks(y)
    lat.set_yticklabels([r["label"] for r in rows], fontsize=7)
    lat.invert_yaxis()
    lat.set_xlim(0, max(m + h for m, h in zip(med, hi)) * 1.35 if med else 1)
    lat.set_xlabel(
        "latency, ms (median; bars: 25th-75th percentile)"
        + (f"\n{latency_note}" if latency_note else "")
    )
    lat.set_title("latency")
    lat.grid(True, axis="x", alpha=0.3)
    if acc is None:
        fig.tight_layout()
        return fig
    acc.barh(y, [s if s is not None and math.isfinite(s) else 0 for s in scores], color=colours)
    for i, s in enumerate(scores):
        acc.text(
            s if s is not None and math.isfinite(s) else 0,
            i,
            f"  {s:.4g}" if s is not None else "  -",
            va="center",
            fontsize=7,
        )
    acc.set_yticks(y)
    acc.set_yticklabels([])
    acc.invert_yaxis()
    if known:  # (always, here)
        low, high = min(known), max(known)
        pad = (high - low) * 0.5 or abs(high) * 0.02 or 0.05
        acc.set_xlim(low - pad if low < 0 else max(low - pad, 0), high + pad * 2)
    acc.set_xlabel(f"{metric} (higher is better)")
    acc.set_title("accuracy")
    acc.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def loss_figure(curves: dict[str, list[tuple[float, float]]], *, title: str = "training loss"):
    fig, ax = new_figure(7.0, 3.8)
    for name, points in curves.items():
        xs = [p[0] for p in points]
        ys = [p[1] for p in points]
        ax.plot(xs, ys, marker="o" if len(points) < 30 else None, markersize=3, label=name)
        if points:
            ax.annotate(
                f"{ys[-1]:.3g}",
                (xs[-1], ys[-1]),
                fontsize=7,
                xytext=(3, 0),
                textcoords="offset points",
            )
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    positive = all(y > 0 for pts in curves.values() for _, y in pts)
    if positive and any(len(p) > 1 for p in curves.values()):
        ys = [y for pts in curves.values() for _, y in pts]
        if max(ys) / min(ys) > 20:
            ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def pareto_figure(
    trials: list[dict], *, chosen: str | None, budget: float, metric: str, estimated: bool
):
    """Latency against accuracy drop (left) and against file size (right) for every trial; the
    Pareto front joined, the chosen trial starred and named, the budget as a dashed line."""
    ok = [
        t
        for t in trials
        if t.get("status") == "ok" and t.get("latency_ms") is not None and t.get("drop") is not None
    ]
    fig, (left, right) = new_figure(10.0, 4.6, ncols=2)
    front = sorted((t for t in ok if t.get("on_front")), key=lambda t: t["latency_ms"])
    for t in ok:
        colour = CHOSEN if t["key"] == chosen else (ORIGINAL if not t["steps"] else OTHER)
        within = t.get("within_budget")
        kw = {"color": colour, "alpha": 0.9 if within else 0.45, "s": 28, "edgecolors": "none"}
        left.scatter(t["latency_ms"], max(t["drop"], 0.0), marker="o" if within else "x", **kw)
        right.scatter(t["latency_ms"], t["size_bytes"] / 2**20, marker="o" if within else "x", **kw)
    if front:
        left.plot(
            [t["latency_ms"] for t in front],
            [max(t["drop"], 0.0) for t in front],
            color=OTHER,
            lw=1,
            alpha=0.6,
            label="Pareto front",
        )
    named = {id(left): [], id(right): []}
    for t in ok:
        if t["key"] == chosen or not t["steps"]:
            name = "chosen: " + t["label"] if t["key"] == chosen else "original"
            for ax, yv in ((left, max(t["drop"], 0.0)), (right, t["size_bytes"] / 2**20)):
                if t["key"] == chosen:
                    ax.scatter(
                        t["latency_ms"],
                        yv,
                        marker="*",
                        s=220,
                        color=CHOSEN,
                        edgecolors="black",
                        zorder=5,
                    )
                # the chosen trial's label first: it keeps its place when the two are close
                named[id(ax)].insert(
                    0 if t["key"] == chosen else len(named[id(ax)]), (t["latency_ms"], yv, name)
                )
    left.axhline(budget, color=FAILED, ls="--", lw=1, label=f"budget {budget:g}")
    top = max([max(t["drop"], 0.0) for t in ok] + [budget])
    left.set_ylim(-0.05 * (top or 1.0), 1.15 * (top or 1.0))
    unit = "ms (estimated)" if estimated else "ms"
    left.set_xlabel(f"latency, {unit}")
    left.set_ylabel(f"{metric} drop (lower is better)")
    left.set_title("latency against accuracy drop")
    left.legend(fontsize=7)
    right.set_xlabel(f"latency, {unit}")
    right.set_ylabel("file size, MiB")
    right.set_title("latency against size (x: over the budget)")
    for a in (left, right):
        a.grid(True, alpha=0.3)
    fig.tight_layout()
    for a in (left, right):
        label_points(a, named[id(a)])
    return fig


def op_counts_figure(before: dict[str, int], after: dict[str, int], *, top: int = 15):
    """Nodes per op type before and after a command (the ops that changed most first)."""
    ops = sorted(
        set(before) | set(after),
        key=lambda o: (
            -abs(before.get(o, 0) - after.get(o, 0)) - 1e-3 * max(before.get(o, 0), after.get(o, 0))
        ),
    )[:top]
    fig, ax = new_figure(7.0, max(2.0, 0.3 * len(ops) + 1.0))
    y = list(range(len(ops)))
    ax.barh(
        [i - 0.2 for i in y],
        [before.get(o, 0) for o in ops],
        height=0.4,
        color=ORIGINAL,
        label="before",
    )
    ax.barh(
        [i + 0.2 for i in y],
        [after.get(o, 0) for o in ops],
        height=0.4,
        color=CHOSEN,
        label="after",
    )
    for i, o in enumerate(ops):
        ax.text(
            max(before.get(o, 0), after.get(o, 0)),
            i,
            f"  {before.get(o, 0)} → {after.get(o, 0)}",
            va="center",
            fontsize=7,
        )
    ax.set_yticks(y)
    ax.set_yticklabels(ops, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("nodes")
    ax.set_title("nodes per op type")
    ax.set_xlim(0, max([max(before.get(o, 0), after.get(o, 0)) for o in ops] or [1]) * 1.3)
    ax.legend(fontsize=7)
    ax.grid(True, axis="x", alpha=0.3)
    return fig


__all__ = [
    "before_after_figure",
    "layer_errors_figure",
    "loss_figure",
    "op_counts_figure",
    "pareto_figure",
]
