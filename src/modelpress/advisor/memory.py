"""Memory a pass needs on one device, and the largest batch that fits.

Inference holds the weights, the KV cache of decoder LLMs and a working set (the largest
kernel's input and output for the whole batch; one prompt at a time for LLM prefill, which
serving engines schedule in chunks). Training holds weights, gradients, optimizer state and the
saved activations (``profile.training.training_memory``). A device needs those bytes ×
``ALLOCATOR_SLACK`` + ``RUNTIME_OVERHEAD_GB`` (CUDA context, library workspaces); weights and
cache split across tensor-parallel devices, the working set does not.
"""

from __future__ import annotations

from functools import partial

from modelpress.advisor.catalog import GPU
from modelpress.profile.training import precision_bytes, training_memory
from modelpress.profile.workload import Workload

RUNTIME_OVERHEAD_GB = 1.0  # CUDA context, cuBLAS/cuDNN workspaces, engine buffers
ALLOCATOR_SLACK = 1.10  # caching-allocator fragmentation
MAX_BATCH = 1 << 16


def memory_bytes(
    workload: Workload,
    *,
    task: str,
    precision: str,
    batch: int,
    split: int = 1,
    optimizer: str = "adam",
) -> float:
    """Bytes one device holds (before runtime overhead) for a pass at ``batch`` per device."""
    width = precision_bytes(precision)
    if task == "train":
        mem = training_memory(
            workload.params,
            precision=precision,
            optimizer=optimizer,
            activation_elems=workload.saved_elems_per_sample * batch,
        )
        return mem.total
    weights = workload.params * width
    per_pass = 1 if workload.is_generative else batch
    acts = (
        2
        * max((k.in_elems + k.out_elems for k in workload.kernels), default=0.0)
        * per_pass
        * width
    )
    cache = workload.cache_elems * batch * max(width, 2 if width > 1 else 1)
    return (weights + cache) / split + acts


def device_gb(nbytes: float) -> float:
    """GB a device needs to hold ``nbytes`` of a pass: the allocator's slack and the runtime's
    own memory on top."""
    return nbytes * ALLOCATOR_SLACK / 1e9 + RUNTIME_OVERHEAD_GB


def max_batch(
    workload: Workload,
    gpu: GPU,
    *,
    task: str,
    precision: str,
    num_gpus: int = 1,
    optimizer: str = "adam",
) -> int:
    """Largest per-device batch that fits (0 when not even one sample fits): on one device, or
    for inference split across ``num_gpus`` (tensor parallel)."""
    split = num_gpus if task == "infer" else 1

    def ok(b: int) -> bool:
        need = partial(memory_bytes, workload, task=task, precision=precision, batch=b)
        return any(
            device_gb(need(split=s, optimizer=optimizer)) <= gpu.memory_gb for s in {1, split}
        )

    if not ok(1):
        return 0
    lo, hi = 1, 2
    while hi <= MAX_BATCH and ok(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, MAX_BATCH + 1)
    while hi - lo > 1:  # ok(lo) and not ok(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


__all__ = [
    "ALLOCATOR_SLACK",
    "MAX_BATCH",
    "RUNTIME_OVERHEAD_GB",
    "device_gb",
    "max_batch",
    "memory_bytes",
]
