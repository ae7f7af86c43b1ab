"""The few physical factors that turn datasheet peaks into achievable speed.

- ``gemm_ceiling``: fraction of the dense tensor peak that the best-shaped large GEMM reaches
  (a microbenchmark ceiling: clocks under load, tile scheduling). A device with a measured BF16
  GEMM in the catalog uses its own ceiling instead, at every tensor precision (on the MI300X it
  is 0.51: its software stack, not its datasheet, sets the pace).
- ``simt_ceiling``: the same for FP32 on the SIMT (non-tensor) cores, which get closer to their
  peak (cuBLAS SGEMM reaches about 90%).
- ``matmul``, ``conv``, ``attention``: fraction of that ceiling that a model's GEMMs, convolutions
  and attention products reach at their real shapes (smaller, oddly shaped, im2col or implicit
  GEMM for convolutions).
- ``bandwidth``: fraction of the datasheet DRAM bandwidth that streaming kernels sustain.
- ``kernel_overhead_us``: fixed cost per kernel (launch, ramp-up, tail), which dominates at
  batch 1.
- ``eager``: training runs eagerly (PyTorch autograd: unfused, unplanned kernels, gradient
  kernels that reach less of the peak than an inference engine's forward kernels, BatchNorm
  statistics passes): one factor multiplies both the compute and the bandwidth factors above
  for training, and ``eager_overhead_us`` replaces the per-kernel overhead (host dispatch).
  One factor rather than two: fitted separately, compute and bandwidth trade off against each
  other on one model and do not carry over to another (see the hold-out in the results).

How the defaults were set. The calibration file holds only training runs and GEMM
microbenchmarks, so the two halves are set from different evidence:

- ``gemm_ceiling`` is the median achieved/peak of the NVIDIA GEMM microbenchmarks in
  ``calibration_benchmarks.csv`` (A100 SXM 0.869, A100 PCIe 0.811, H100 SXM 0.803 BF16, and
  the FP8 row 0.709 excluded as a different datapath): 0.811.
- ``matmul``, ``conv``, ``attention``, ``bandwidth`` and ``kernel_overhead_us`` describe a
  compiled inference engine (TensorRT, ONNX Runtime with CUDA graphs) and are physical priors,
  not fitted: model GEMMs at 85% of the ceiling, implicit-GEMM convolutions at 70%, fused
  attention at 60%, 85% of DRAM bandwidth (what STREAM-like copies reach on HBM and GDDR6),
  3 µs per kernel. They are checked, not fitted, against the held-out published inference rows
  in ``published_inference.csv`` (TensorRT BERT, TensorRT-LLM GPT-J / Llama-2-7B): median error
  8.4% over 25 rows, large-batch rows within 1.31x, batch-1 BERT up to 2.04x optimistic with the
  estimator's wave quantisation (8.6% and 2.15x without it; see the results file).
- ``eager`` and ``eager_overhead_us`` are fitted by ``benchmarks/bench_advisor.py`` (least
  squares on log(predicted/measured) over the 34 single-GPU training rows); see
  ``benchmarks/results/advisor.md`` for the errors, the leave-one-GPU-out and the hold-out by
  model.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Efficiency:
    gemm_ceiling: float = 0.811
    simt_ceiling: float = 0.90
    matmul: float = 0.85
    conv: float = 0.70
    attention: float = 0.60
    bandwidth: float = 0.85
    kernel_overhead_us: float = 3.0
    # fitted on calibration_benchmarks.csv by benchmarks/bench_advisor.py
    eager: float = 0.801
    eager_overhead_us: float = 80.14
    # sustained clock under load = min(boost, clock_headroom x base); see clocks.py
    clock_headroom: float = 1.5

    def to_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


DEFAULT_EFFICIENCY = Efficiency()

__all__ = ["DEFAULT_EFFICIENCY", "Efficiency"]
