"""What a record keeps of a model and of the advisor's view of it, for the page to draw later.

- ``model_card``: inputs and outputs, op counts, parameters and their bytes, the file's size,
  FLOPs and bytes moved per run at batch 1 (dynamic dimensions set to 1, or to ``dims``), and the
  largest activation a node writes (a floor on the memory a run needs beyond the weights);
- ``roofline_of_workload``: a device's compute and bandwidth roofs at a precision and the model's kernels
  placed at their arithmetic intensity and predicted speed (``advisor.estimate.kernel_points``);
- ``costs_data``: the advisor's ranked devices: throughput against cost per million;
- ``advisor_charts``: both, for a model, as the advisor would answer for its inference.

Everything is plain JSON, so a record can be read and drawn where the model is not.
"""

from __future__ import annotations

import onnx_ir as ir

from modelpress.advisor.catalog import GPU, load_catalog
from modelpress.advisor.efficiency import DEFAULT_EFFICIENCY, Efficiency
from modelpress.advisor.estimate import kernel_points, roof_for
from modelpress.advisor.recommend import Recommendation, Request, recommend
from modelpress.errors import ModelpressError
from modelpress.ir import graph_stats, model_bytes
from modelpress.profile import profile_model
from modelpress.profile.workload import workload_from_onnx
from modelpress.verify.inputs import resolve_shape


def _shapes(model: ir.Model, dims: dict[str, int] | None) -> tuple[dict, list[str]]:

    dims = dict(dims or {})
    shapes, defaulted = {}, []
    for value in model.graph.inputs:
        if value.name in model.graph.initializers or value.shape is None:
            continue
        defaulted += [str(d) for d in value.shape if not isinstance(d, int) and str(d) not in dims]
        shapes[value.name] = resolve_shape(value, dims, default_dim=1)
    return shapes, sorted(set(defaulted))


def model_card(model: ir.Model, *, name: str = "", dims: dict[str, int] | None = None) -> dict:

    stats = graph_stats(model)
    shapes, defaulted = _shapes(model, dims)
    card = {
        "name": name,
        "inputs": stats.inputs,
        "outputs": stats.outputs,
        "opsets": stats.opsets,
        "op_counts": stats.op_counts,
        "nodes": stats.node_count,
        "parameters": stats.parameters,
        "parameter_bytes": stats.parameter_bytes,
        "file_bytes": len(model_bytes(model)),
        "dims_set_to_1": defaulted,
    }
    try:
        cost = profile_model(model, shapes)
    except Exception as exc:  # noqa: BLE001 - a card without FLOPs is still a card
        card["flops_error"] = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return card
    card.update(
        flops=cost.flops,
        bytes_moved=cost.bytes,
        largest_activation_bytes=max((n.activation_bytes for n in cost.nodes), default=0),
        unknown_shapes=cost.unknown_shapes,
    )
    return card


def advisor_charts(
    model: ir.Model,
    *,
    name: str,
    precision: str,
    gpu: GPU | None = None,
    batch: int = 1,
    seq: int | None = None,
) -> tuple[dict, list[str]]:
    """The advisor's view of ``model`` for inference at ``precision``: ``{"costs", "roofline"}``
    (the roofline on ``gpu``, or on the device the advisor ranks first), and notes on what could
    not be drawn."""

    charts: dict = {}
    try:
        workload = workload_from_onnx(model, name=name, seq=seq)
    except Exception as exc:  # noqa: BLE001 - a page without the advisor's charts is still a page
        return charts, [
            f"no advisor charts: the model could not be profiled ({str(exc).splitlines()[0][:120]})"
        ]
    notes = []
    try:
        rec = recommend(
            workload,
            list(load_catalog().gpus),
            Request(task="infer", precision=precision, batch=batch),
        )
        charts["costs"] = costs_data(rec)
        gpu = gpu or (rec.ranked[0].gpu if rec.ranked else None)
    except ModelpressError as exc:
        notes.append(f"no cost chart: {exc}")
    if gpu is not None:
        try:
            charts["roofline"] = roofline_of_workload(
                workload, gpu, precision=precision, batch=batch
            )
        except ModelpressError as exc:
            notes.append(f"no roofline: {exc}")
    return charts, notes


def roofline_of_workload(
    workload, gpu: GPU, *, precision: str, batch: int, eff: Efficiency = DEFAULT_EFFICIENCY
) -> dict:

    roof = roof_for(gpu, precision, eff)
    points = [
        {"kind": p.kind, "intensity": p.intensity, "tflops": p.tflops}
        for p in kernel_points(workload, gpu, precision=precision, batch=batch, eff=eff)
        if p.flops > 0 and p.bytes > 0
    ]
    return {
        "workload": workload.name,
        "gpu": gpu.name,
        "precision": precision,
        "batch": batch,
        "bandwidth_gbs": roof.bandwidth_gbs * eff.bandwidth,
        "roofs": {
            "tensor": roof.tensor_tflops * roof.gemm_ceiling * eff.matmul,
            "vector": roof.vector_tflops * roof.gemm_ceiling,
        },
        "points": points,
    }


def costs_data(rec: Recommendation) -> dict:
    rows = [r for r in rec.ranked if r.cost and r.cost.best_per_million is not None]
    return {
        "workload": rec.workload,
        "scenario": rec.scenario,
        "unit": rows[0].estimate.unit if rows else "samples/s",
        "devices": [
            {
                "gpu": r.gpu.name,
                "rank": r.rank,
                "usd_per_million": r.cost.best_per_million,
                "throughput": r.estimate.throughput,
                "latency_ms": r.estimate.latency_ms,
                "batch": r.estimate.batch,
            }
            for r in rows
        ],
    }


__all__ = ["advisor_charts", "costs_data", "model_card", "roofline_of_workload"]
