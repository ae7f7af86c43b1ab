"""Where the chosen model will run, and how a candidate's latency is obtained there.

- ``cpu``: measured on this machine under ONNX Runtime, the candidate and the original timed
  interleaved (one run of each per round, so a slow period of a shared machine hits both alike);
  the ratio of their medians is what trials measured at different times compare on.
- a GPU of the advisor's catalog: estimated by the advisor (roofline per kernel at the candidate's
  precision, ``advisor.estimate``), and marked as an estimate.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from modelpress.advisor.catalog import GPU, load_catalog
from modelpress.advisor.estimate import estimate
from modelpress.ir.stats import iter_nodes
from modelpress.profile.workload import workload_from_onnx
from modelpress.runtime.measure import compare_latency

# Ops whose presence makes a model's compute int8 (activations quantized, not only weights).
INT8_OPS = frozenset(
    {
        "QuantizeLinear",
        "DynamicQuantizeLinear",
        "MatMulInteger",
        "ConvInteger",
        "QLinearConv",
        "QLinearMatMul",
    }
)


@dataclass(frozen=True)
class Target:
    name: str  # "cpu" or the catalog's GPU name
    gpu: GPU | None = None

    @property
    def is_gpu(self) -> bool:
        return self.gpu is not None


def target_for(name: str) -> Target:
    """``cpu`` (this machine), or a GPU of the advisor's catalog by a loose name."""
    if name.strip().lower() in ("cpu", "this", "here"):
        return Target("cpu")

    gpu = load_catalog().find(name)
    return Target(gpu.name, gpu)


@dataclass
class Latency:
    median_ms: float
    p25_ms: float
    p75_ms: float
    reference_ms: float  # the original's median, in the same measurement
    runs: int = 0
    estimated: bool = False
    precision: str | None = None
    source: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.median_ms / max(self.reference_ms, 1e-12)

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["ratio"] = self.ratio
        return d


def precision_of(model: ir.Model) -> str:
    """The precision a model computes in, for the advisor: int8 when its activations are
    quantized, else the float type most of its float weights have."""

    if any(n.op_type in INT8_OPS for n in iter_nodes(model.graph)):
        return "int8"
    counts: Counter[str] = Counter()
    for v in model.graph.initializers.values():
        if v.const_value is not None and v.dtype is not None:
            counts[v.dtype.name] += int(np.prod(v.const_value.shape.numpy()))
    kinds = {"FLOAT16": "fp16", "BFLOAT16": "bf16", "FLOAT": "fp32", "DOUBLE": "fp32"}
    floats = [(n, kinds[k]) for k, n in counts.items() if k in kinds]
    return max(floats)[1] if floats else "fp32"


def measure_cpu(
    candidate: ir.Model, reference: ir.Model, feeds: dict[str, np.ndarray], *, seconds: float
) -> Latency:

    # (as many interleaved runs as ``seconds`` allows: a small model's runs are short and noisy)
    ref, cand = compare_latency([reference, candidate], feeds, budget_s=seconds, max_runs=100_000)
    return Latency(
        cand.median_ms,
        cand.p25_ms,
        cand.p75_ms,
        ref.median_ms,
        runs=cand.runs,
        source="measured on this CPU (ONNX Runtime, interleaved with the original)",
    )


def estimate_gpu(
    candidate: ir.Model, reference_ms: float | None, gpu: GPU, *, batch: int, seq: int | None
) -> Latency:
    """The advisor's latency for one batch on ``gpu`` at the candidate's precision."""

    precision = precision_of(candidate)
    workload = workload_from_onnx(candidate, name="candidate", seq=seq)
    est = estimate(workload, gpu, task="infer", precision=precision, batch=batch)
    ms = float(est.latency_ms)
    return Latency(
        ms,
        ms,
        ms,
        reference_ms if reference_ms is not None else ms,
        estimated=True,
        precision=est.precision_used,
        source=f"estimated by the advisor for {gpu.name} ({est.precision_used}, batch {batch})",
        notes=list(est.notes),
    )


__all__ = ["Latency", "Target", "estimate_gpu", "measure_cpu", "precision_of", "target_for"]
