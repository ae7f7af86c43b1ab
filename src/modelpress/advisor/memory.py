"""Memory a pass needs on one device, and the largest batch that fits.

Inference holds the weights, the KV cache of decoder LLMs and a working set (the largest
kernel's input and output for the whole batch; one prompt at a time for LLM prefill, which
serving engines schedule in chunks). Training holds weights, gradients, optimizer state and the
saved activations (``profile.training.training_memory``). A device needs those bytes ×
``ALLOCATOR_SLACK`` + ``RUNTIME_OVERHEAD_GB`` (CUDA context, library workspaces); weights and
cache split across tensor-parallel devices, the working set does not.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelpress.profile.training import precision_bytes, training_memory
from modelpress.profile.workload import Workload

RUNTIME_OVERHEAD_GB = 1.0  # CUDA context, cuBLAS/cuDNN workspaces, engine buffers
ALLOCATOR_SLACK = 1.10  # caching-allocator fragmentation
MAX_BATCH = 1 << 16


@dataclass(frozen=True)
class Footprint:
    """What a pass of ``workload`` holds on one device, by batch (module rule)."""

    workload: Workload
    task: str
    precision: str
    optimizer: str = "adam"

    def bytes(self, batch: int, *, split: int = 1) -> float:
        """Bytes one device holds (before runtime overhead) at ``batch`` per device, with the
        weights and cache split ``split`` ways."""
        w = self.workload
        width = precision_bytes(self.precision)
        if self.task == "train":
            mem = training_memory(
                w.params,
                precision=self.precision,
                optimizer=self.optimizer,
                activation_elems=w.saved_elems_per_sample * batch,
            )
            return mem.total
        per_pass = 1 if w.is_generative else batch
        largest = max((k.in_elems + k.out_elems for k in w.kernels), default=0.0)
        acts = 2 * largest * per_pass * width
        cache = w.cache_elems * batch * max(width, 2 if width > 1 else 1)
        return (w.params * width + cache) / split + acts

    def device_gb(self, batch: int, *, split: int = 1) -> float:
        """GB a device needs: the bytes with the allocator's slack and the runtime's own."""
        return self.bytes(batch, split=split) * ALLOCATOR_SLACK / 1e9 + RUNTIME_OVERHEAD_GB

    def max_batch(self, capacity_gb: float, *, num_gpus: int = 1) -> int:
        """Largest per-device batch that fits ``capacity_gb`` (0 when not even one sample fits):
        on one device, or for inference split across ``num_gpus`` (tensor parallel)."""
        split = num_gpus if self.task == "infer" else 1

        def ok(b: int) -> bool:
            return any(self.device_gb(b, split=s) <= capacity_gb for s in {1, split})

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


__all__ = ["ALLOCATOR_SLACK", "MAX_BATCH", "RUNTIME_OVERHEAD_GB", "Footprint"]
