"""Calibrate on this machine: measure the CPU's roof, predict the model on it, time the model.

Four measurements, each the median of several runs:

- compute: a large fp32 matrix product under ONNX Runtime (GFLOP/s);
- bandwidth: a NumPy copy of an array much larger than the caches (bytes read + written per s);
- per-node overhead: a chain of 200 tiny Add nodes under ONNX Runtime (µs per node);
- the model itself under ONNX Runtime at the requested batch (ms per batch).

The measured compute and bandwidth become the roof of a ``Roof`` for "this CPU" (efficiency 1:
they are already achieved figures) and the advisor's estimate on it is set against the measured
model time. The ratio says how far the roofline is from this machine for this model, in the same
way the published GPU measurements check it on GPUs.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace

import numpy as np

from modelpress.advisor.efficiency import DEFAULT_EFFICIENCY, Efficiency
from modelpress.advisor.estimate import Target, _time
from modelpress.advisor.launches import launches
from modelpress.advisor.roof import Roof
from modelpress.profile.workload import Workload, input_shapes
from modelpress.runtime.measure import machine_peak_gflops, time_interleaved
from modelpress.runtime.ort import session
from modelpress.verify.inputs import generate_inputs

COPY_BYTES = 256 * 2**20
CHAIN_NODES = 200


@dataclass(frozen=True)
class CpuCalibration:
    cpu: str
    threads: int
    matmul_gflops: float
    copy_gbs: float
    node_overhead_us: float
    batch: int
    predicted_ms: float | None
    measured_ms: float | None
    measured_p25_ms: float | None
    measured_p75_ms: float | None
    bound: str | None

    @property
    def ratio(self) -> float | None:
        if self.predicted_ms is None or not self.measured_ms:
            return None
        return self.predicted_ms / self.measured_ms

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["predicted_over_measured"] = self.ratio
        return d


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def measure_copy_gbs(*, nbytes: int = COPY_BYTES, runs: int = 7) -> float:
    src = np.ones(nbytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        samples.append(time.perf_counter() - t0)
    return 2 * nbytes / float(np.median(samples)) / 1e9  # read + write


def measure_node_overhead_us(*, nodes: int = CHAIN_NODES, runs: int = 20) -> float:
    """ONNX Runtime's fixed cost per node: a chain of Adds on a 16-element tensor, whose
    arithmetic is negligible, divided by its length."""
    import onnx_ir as ir

    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1, 16]))
    value, chain = x, []
    for i in range(nodes):
        node = ir.node("Add", [value, value])
        node.outputs[0].name = f"a{i}"
        chain.append(node)
        value = node.outputs[0]
    value.type, value.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([1, 16])
    model = ir.Model(
        ir.Graph(inputs=[x], outputs=[value], nodes=chain, opset_imports={"": 17}), ir_version=8
    )
    sess = session(model, optimize="disabled")  # keep every node: fusing them would hide the cost
    feeds = {"x": np.ones((1, 16), dtype=np.float32)}
    timing = time_interleaved([lambda: sess.run(None, feeds)], runs=runs, warmup=3)[0]
    return timing.median_ms * 1e3 / nodes


def cpu_roof(matmul_gflops: float, copy_gbs: float) -> Roof:
    mem_gb = (
        os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
        if hasattr(os, "sysconf")
        else 0.0
    )
    return Roof("this CPU", matmul_gflops / 1e3, matmul_gflops / 1e3, copy_gbs, 1.0, mem_gb, "fp32")


def predict_cpu_ms(
    workload: Workload,
    roof: Roof,
    *,
    batch: int,
    node_overhead_us: float,
    eff: Efficiency = DEFAULT_EFFICIENCY,
) -> tuple[float, str]:
    """Predicted ms per batch on the measured CPU roof: measured peaks need no ceiling or
    bandwidth factor; the per-kind factors and the measured per-node cost still apply."""
    cpu_eff = replace(eff, bandwidth=1.0, kernel_overhead_us=node_overhead_us)
    t = _time(launches(workload.kernels, fuse=True), batch, Target(roof, cpu_eff, 4))
    return t.seconds * 1e3, t.bound


def calibrate_cpu(
    workload: Workload, *, model=None, batch: int = 1, seq: int | None = None, runs: int = 10
) -> CpuCalibration:
    """Measure this CPU and, when ``model`` (an ONNX model) is given, time it against the prediction."""

    feeds = None
    if model is not None:
        shapes, fixed = input_shapes(model, batch, seq)
        batch = fixed or batch  # a graph with a fixed batch runs at that batch
        feeds = generate_inputs(model, shapes=shapes)
    gflops = machine_peak_gflops(n=1024, runs=5)
    copy = measure_copy_gbs()
    overhead = measure_node_overhead_us()
    roof = cpu_roof(gflops, copy)
    predicted, bound = predict_cpu_ms(workload, roof, batch=batch, node_overhead_us=overhead)
    measured = p25 = p75 = None
    if feeds is not None:
        sess = session(model, optimize="all")
        timing = time_interleaved([lambda: sess.run(None, feeds)], runs=runs, warmup=2)[0]
        measured, p25, p75 = timing.median_ms, timing.p25_ms, timing.p75_ms
    return CpuCalibration(
        cpu_name(),
        os.cpu_count() or 1,
        gflops,
        copy,
        overhead,
        batch,
        predicted,
        measured,
        p25,
        p75,
        bound,
    )


__all__ = [
    "CpuCalibration",
    "calibrate_cpu",
    "cpu_roof",
    "measure_copy_gbs",
    "measure_node_overhead_us",
    "predict_cpu_ms",
]
