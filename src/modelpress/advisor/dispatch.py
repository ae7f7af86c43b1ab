"""Eager passes: the host dispatches op by op while the GPU runs what is already queued.

PyTorch without a compiler issues every op from Python: the host spends ``eager_overhead_us`` on
each (Python, the dispatcher, the CUDA launch). CUDA launches are asynchronous, so the host runs
ahead of the GPU and an inference pass takes

    max(ops × eager_overhead_us, the GPU's own time: kernels plus their fixed cost)

(``overlapped``): at batch 1 the host sets the pace, at large batches the GPU does. NVIDIA's own
table shows it (``published_inference.csv``, PyTorch ResNet-50 v1.5 on a DGX-1 V100): FP32
latency 10.37, 10.24, 10.46 ms at batch 1, 2, 4 while the GPU's work grows fourfold, then it rises
with the batch (16.07 ms at 16). A sum of host and GPU time would grow from batch 1.

Mixed precision in eager PyTorch is autocast (``torch.autocast``, NVIDIA's examples since 2021):
each convolution or matrix product casts its FP32 weight to FP16 on every call (autocast's cast
cache lives one autocast region, one forward), one more op dispatched per weighted tensor op
(``autocast_casts``). The same table: batch-1 AMP is *slower* than FP32, 12.78 against 10.37 ms
on the V100 and 12.96 against 10.70 ms on the T4, with less GPU work: 54 casts on top of
ResNet-50's 174 ops.

Training sums instead (``estimate``): autograd and the optimizer synchronise within a step, and
``eager_overhead_us`` fitted there also holds the GPU-side cost of small unfused kernels. A
training step under autocast casts every weight in the forward and casts its gradient back.
"""

from __future__ import annotations

from modelpress.profile.workload import TENSOR_KINDS

AUTOCAST = ("fp16", "bf16")  # eager precisions that run under torch.autocast


def autocast_casts(rows, precision: str) -> int:
    """Casts autocast adds to one eager pass at ``precision``: one per weighted tensor op
    (``rows`` as ``launches.launches`` gives them)."""
    if precision not in AUTOCAST:
        return 0
    return sum(1 for kind, _f, weights, *_ in rows if kind in TENSOR_KINDS and weights)


def overlapped(host_ops: int, gpu_s: float, eager_overhead_us: float) -> float:
    """Seconds of an eager inference pass: the host dispatching ``host_ops`` ops at
    ``eager_overhead_us`` each, overlapped with ``gpu_s`` of GPU work."""
    return max(host_ops * eager_overhead_us * 1e-6, gpu_s)


__all__ = ["AUTOCAST", "autocast_casts", "overlapped"]
