"""The few physical factors that turn datasheet peaks into achievable speed.

- ``gemm_ceiling``: fraction of the dense tensor peak that the best-shaped large GEMM reaches
  (a microbenchmark ceiling: tile scheduling, clocks under load). A device with a measured BF16
  GEMM in the catalog uses its own ceiling instead, at every tensor precision (on the MI300X it
  is 0.51: its software stack, not its datasheet, sets the pace).
- ``simt_ceiling``: the same for FP32 on the SIMT (non-tensor) cores, which get closer to their
  peak (cuBLAS SGEMM reaches about 90%).
- ``matmul``, ``conv``, ``attention``: fraction of that ceiling that a model's GEMMs, implicit-GEMM
  convolutions and attention products reach on tensor cores at their real shapes (FP32
  convolutions on SIMT cores run as well as SGEMM: no conv factor there). ``conv`` is fitted:
  TensorRT's INT8 ResNet-50 (MLPerf) reaches the GEMM ceiling on every card that holds its
  clock, where the earlier prior (0.70) left every such row 10-13% slow.
- ``bandwidth``: fraction of the datasheet DRAM bandwidth that streaming kernels sustain.
- ``kernel_overhead_us``: fixed cost of a compiled kernel (launch, ramp-up, tail, the first DRAM
  round trips), which dominates at batch 1; counted in SM clock cycles and stated at 1410 MHz
  (``clocks.kernel_overhead_s``: a card at f MHz pays it × 1410 / f).
- ``clock_headroom``: how far above its base clock a card runs under a load that keeps it busy
  (``clocks.py``: sustained clock = min(boost, headroom × base × activity^(-1/3))); what makes a
  70 W T4 or L4 slower than its boost-clock peaks say.
- ``eager``: training runs eagerly (PyTorch autograd: unfused kernels, gradient kernels that reach
  less of the peak than an inference engine's forward kernels, BatchNorm statistics passes): one
  factor multiplies the compute and bandwidth factors above for training. ``eager_overhead_us``
  is the host's cost per op of an eager pass (Python, dispatch, launch): summed with the kernels
  per launch in training; overlapped with the GPU's work in eager inference (``dispatch.py``).

How the defaults were set, and from which measurements: ``docs/defaults.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Efficiency:
    gemm_ceiling: float = 0.811
    simt_ceiling: float = 0.90
    matmul: float = 0.85
    conv: float = 1.0
    attention: float = 0.60
    bandwidth: float = 0.85
    # fitted by benchmarks/bench_advisor.py on the published training and inference rows
    kernel_overhead_us: float = 7.859  # at 1410 MHz
    eager: float = 0.673
    eager_overhead_us: float = 58.1
    # sustained clock under load = min(boost, clock_headroom x base x activity^-1/3); clocks.py
    clock_headroom: float = 1.377

    def to_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


DEFAULT_EFFICIENCY = Efficiency()

__all__ = ["DEFAULT_EFFICIENCY", "Efficiency"]
