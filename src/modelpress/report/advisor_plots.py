"""Figures for the advisor's HTML page (matplotlib, the ``report`` extra).

- throughput against cost per million for the ranked devices (up and to the left is better);
- a roofline for one device: attainable TFLOPS against arithmetic intensity (FLOPs per byte),
  min(compute ceiling, bandwidth × intensity), with the model's kernels placed at their
  intensity and predicted speed.
"""

from __future__ import annotations

import numpy as np

from modelpress.advisor.catalog import GPU
from modelpress.advisor.efficiency import DEFAULT_EFFICIENCY, Efficiency
from modelpress.advisor.estimate import kernel_points, roof_for
from modelpress.advisor.recommend import Recommendation
from modelpress.profile.training import precision_bytes
from modelpress.profile.workload import Workload
from modelpress.report.html import new_figure


def throughput_vs_cost(rec: Recommendation):
    fig, ax = new_figure()
    rows = [r for r in rec.ranked if r.cost and r.cost.best_per_million is not None]
    for r in rows:
        ax.scatter(r.cost.best_per_million, r.estimate.throughput, s=30)
        ax.annotate(
            r.gpu.name.replace("NVIDIA ", ""),
            (r.cost.best_per_million, r.estimate.throughput),
            fontsize=7,
            xytext=(3, 3),
            textcoords="offset points",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    from matplotlib.ticker import NullFormatter

    ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels on a log axis collide
    ax.yaxis.set_minor_formatter(NullFormatter())
    unit = rows[0].estimate.unit if rows else "samples/s"
    ax.set_xlabel("USD per million (cheaper of cloud and owned)")
    ax.set_ylabel(f"throughput ({unit})")
    ax.set_title(f"{rec.workload}: throughput against cost ({rec.scenario})")
    ax.grid(True, which="both", alpha=0.3)
    return fig


def roofline(
    workload: Workload,
    gpu: GPU,
    *,
    precision: str,
    batch: int,
    eff: Efficiency = DEFAULT_EFFICIENCY,
):
    roof = roof_for(gpu, precision, eff)
    points = [
        p
        for p in kernel_points(workload, gpu, precision=precision, batch=batch, eff=eff)
        if p.flops > 0 and p.bytes > 0
    ]
    fig, ax = new_figure()
    ai = np.logspace(-2, 4, 200)
    bw = roof.bandwidth_gbs * 1e9 * eff.bandwidth
    for label, peak in (
        ("tensor", roof.tensor_tflops * roof.gemm_ceiling * eff.matmul),
        ("vector", roof.vector_tflops * roof.gemm_ceiling),
    ):
        ax.plot(ai, np.minimum(peak, bw * ai / 1e12), label=f"{label} roof ({peak:.0f} TFLOPS)")
    kinds = sorted({p.kind for p in points})
    for kind in kinds:
        sel = [p for p in points if p.kind == kind]
        ax.scatter([p.intensity for p in sel], [p.tflops for p in sel], s=12, alpha=0.7, label=kind)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOPs per byte)")
    ax.set_ylabel("TFLOPS")
    width = precision_bytes(precision)
    ax.set_title(f"{workload.name} on {gpu.name}, {precision} ({width} B/elem), batch {batch}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return fig


__all__ = ["roofline", "throughput_vs_cost"]
