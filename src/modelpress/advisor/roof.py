"""What a device offers a kernel: peaks after precision fallback and clocks, bandwidth, caches.

- Precision: 8-bit work runs at the better of the 8-bit and 16-bit rates (``GPU.peak_tflops``);
  FP32 without tensor units runs on the SIMT cores, whose GEMMs get much closer to their peak
  (``Efficiency.simt_ceiling``) than tensor-core GEMMs do.
- Clocks: peaks are scaled to the clock the card sustains at the pass's load (``clocks.py``).
- A device whose BF16 GEMM was measured (``matmul_bf16_tflops_measured``) uses that measurement
  as its ceiling at every tensor precision: its software stack and clocks under load reach the
  same fraction of the tensor peak at the other tensor precisions.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelpress.advisor.catalog import GPU
from modelpress.advisor.clocks import sustained_clock
from modelpress.advisor.efficiency import DEFAULT_EFFICIENCY, Efficiency
from modelpress.errors import OptionError


@dataclass(frozen=True)
class Roof:
    """What a kernel sees of a device: peaks after precision fallback, bandwidth, capacity."""

    name: str
    tensor_tflops: float
    vector_tflops: float
    bandwidth_gbs: float
    gemm_ceiling: float
    memory_gb: float
    precision_used: str
    sm_count: float | None = None  # streaming multiprocessors / compute units; None: no wave model
    clock_note: str = ""  # set when the card cannot hold its boost clock under load
    l2_bytes: float = 0.0  # last-level cache; 0: unknown (every activation goes to DRAM)
    clock_mhz: float | None = None  # the SM clock it runs at (None: unknown)


def roof_for(
    gpu: GPU, precision: str, eff: Efficiency = DEFAULT_EFFICIENCY, *, activity: float = 1.0
) -> Roof:
    """What ``gpu`` offers a kernel at ``precision`` under a load that keeps it busy a share
    ``activity`` of the time (1: a dense load that holds the card at its power limit; 0: boost)."""
    peak = gpu.peak_tflops(precision)
    if peak is None:
        raise OptionError(f"{gpu.name} has no {precision} (or fallback) peak in the catalog")
    tflops, used = peak
    ceiling = eff.simt_ceiling if used == "fp32" else eff.gemm_ceiling
    clock = sustained_clock(gpu, eff.clock_headroom, activity=activity)
    tensor_clock = clock.fraction
    if gpu.matmul_bf16_tflops_measured and used != "fp32" and gpu.bf16_tflops:
        ceiling = gpu.matmul_bf16_tflops_measured / gpu.bf16_tflops
        tensor_clock = 1.0  # the measurement ran at the clock the card sustains
    return Roof(
        gpu.name,
        tflops * tensor_clock,
        gpu.vector_tflops() * clock.fraction,
        gpu.memory_bandwidth_gbs,
        ceiling,
        gpu.memory_gb,
        used,
        gpu.sm_count,
        clock.note if tensor_clock < 1 else "",
        (gpu.l2_mb or 0.0) * 2**20,
        clock.mhz,
    )


__all__ = ["Roof", "roof_for"]
