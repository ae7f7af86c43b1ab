"""Figures of the advisor (matplotlib, the ``report`` extra), drawn from plain data so that a page
built from records later draws the same charts as ``advise --html`` does now.

- throughput against cost per million for the ranked devices (up and to the left is better);
- a roofline for one device: attainable TFLOPS against arithmetic intensity (FLOPs per byte),
  min(compute ceiling, bandwidth × intensity), with the model's kernels placed at their
  intensity and predicted speed.
"""

from __future__ import annotations

import numpy as np

from modelpress.advisor.catalog import GPU
from modelpress.advisor.efficiency import DEFAULT_EFFICIENCY, Efficiency
from modelpress.advisor.recommend import Recommendation
from modelpress.profile.training import precision_bytes
from modelpress.profile.workload import Workload
from modelpress.report.cards import costs_data, roofline_of_workload
from modelpress.report.html import label_points, new_figure


def _no_minor_labels(ax) -> None:
    """Minor labels on a log axis collide, but an axis spanning less than a decade has no major
    tick to label: it keeps them."""
    from matplotlib.ticker import NullFormatter

    for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
        if lo > 0 and hi / lo >= 10:
            axis.set_minor_formatter(NullFormatter())


def costs_figure(data: dict):
    """``data``: ``report.cards.costs_data``."""
    fig, ax = new_figure()
    rows = data.get("devices", [])
    for r in rows:
        ax.scatter(r["usd_per_million"], r["throughput"], s=30)
    if rows:
        ax.set_xscale("log")
        ax.set_yscale("log")
        _no_minor_labels(ax)
        # the best devices first (highest throughput per dollar): they keep their labels
        ranked = sorted(rows, key=lambda r: -r["throughput"] / max(r["usd_per_million"], 1e-12))
        label_points(
            ax,
            [
                (r["usd_per_million"], r["throughput"], r["gpu"].replace("NVIDIA ", ""))
                for r in ranked
            ],
        )
    ax.set_xlabel("USD per million (cheaper of cloud and owned)")
    ax.set_ylabel(f"throughput ({data.get('unit', 'samples/s')})")
    ax.set_title(
        f"{data.get('workload', '')}: throughput against cost ({data.get('scenario', '')})"
    )
    ax.grid(True, which="both", alpha=0.3)
    return fig


def roofline_figure(data: dict):
    """``data``: ``report.cards.roofline_data``."""
    fig, ax = new_figure()
    ai = np.logspace(-2, 4, 200)
    bw = data["bandwidth_gbs"] * 1e9
    for label, peak in data["roofs"].items():
        ax.plot(ai, np.minimum(peak, bw * ai / 1e12), label=f"{label} roof ({peak:.0f} TFLOPS)")
    points = data.get("points", [])
    for kind in sorted({p["kind"] for p in points}):
        sel = [p for p in points if p["kind"] == kind]
        ax.scatter(
            [p["intensity"] for p in sel], [p["tflops"] for p in sel], s=12, alpha=0.7, label=kind
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    _no_minor_labels(ax)
    ax.set_xlabel("arithmetic intensity (FLOPs per byte)")
    ax.set_ylabel("TFLOPS")
    width = precision_bytes(data["precision"])
    ax.set_title(
        f"{data['workload']} on {data['gpu']}, {data['precision']} ({width} B/elem), batch {data['batch']}"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def throughput_vs_cost(rec: Recommendation):
    return costs_figure(costs_data(rec))


def roofline(
    workload: Workload,
    gpu: GPU,
    *,
    precision: str,
    batch: int,
    eff: Efficiency = DEFAULT_EFFICIENCY,
):
    return roofline_figure(
        roofline_of_workload(workload, gpu, precision=precision, batch=batch, eff=eff)
    )


__all__ = ["costs_figure", "roofline", "roofline_figure", "throughput_vs_cost"]
