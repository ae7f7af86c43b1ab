"""The ONNX Runtime backend (the default).

Devices come from the execution providers installed with onnxruntime: CUDA (``cuda:N``), TensorRT,
OpenVINO, DirectML, CoreML; the CPU is always there. Session options carry clear names
(``OrtOptions``); on a GPU the memory arena grows on demand under an optional limit instead of
reserving the card, and I/O binding keeps outputs on the device between calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

from modelpress.runtime.backend import register_backend
from modelpress.runtime.ort import session, session_options

_PROVIDER_DEVICES = {
    "TensorrtExecutionProvider": "tensorrt",
    "OpenVINOExecutionProvider": "openvino",
    "DmlExecutionProvider": "dml",
    "CoreMLExecutionProvider": "coreml",
}


@dataclass(frozen=True)
class OrtOptions:
    intra_op_threads: int | None = None
    inter_op_threads: int | None = None
    parallel: bool = False  # run independent branches concurrently (inter-op parallelism)
    optimize: str = "all"  # disabled | basic | extended | all
    memory_arena: bool = True
    memory_limit_mb: int | None = None  # per device, for GPU providers
    io_binding: bool = False
    profile: bool = False
    # Idle threads spin for a while after each run, waiting for the next: fastest for back-to-back
    # runs, but CPU taken from whatever else runs beside the model (pre-processing workers).
    spin: bool = True


def _cuda_count() -> int:
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return 0
    try:  # ORT does not report the count itself; ask the driver through torch when present
        import torch

        return max(torch.cuda.device_count(), 1)
    except ImportError:
        return 1


class OrtPrepared:
    def __init__(self, model: ir.Model | bytes | str, device: str, options: OrtOptions):
        self.device = device
        self.options = options
        so = session_options(
            optimize=options.optimize,
            intra_op_threads=options.intra_op_threads,
            inter_op_threads=options.inter_op_threads,
            parallel=options.parallel,
            profile=options.profile,
        )
        so.enable_cpu_mem_arena = options.memory_arena
        if not options.spin:
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            so.add_session_config_entry("session.inter_op.allow_spinning", "0")
        if options.profile:
            import os
            import tempfile

            # the profiler writes a JSON trace; keep it out of the user's working directory
            so.profile_file_prefix = os.path.join(tempfile.gettempdir(), "modelpress-ort-profile")
        self.session = session(model, options=so, providers=self._providers(device))
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def _providers(self, device: str) -> list:
        if device.startswith("cuda"):
            opts = {
                "device_id": int(device.split(":")[1]),
                "arena_extend_strategy": "kSameAsRequested",
            }
            if self.options.memory_limit_mb:
                opts["gpu_mem_limit"] = self.options.memory_limit_mb * 2**20
            return [("CUDAExecutionProvider", opts), "CPUExecutionProvider"]
        for provider, name in _PROVIDER_DEVICES.items():
            if device == name:
                return [provider, "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.options.io_binding and not self.device == "cpu":
            binding = self.session.io_binding()
            for name, arr in feeds.items():
                binding.bind_cpu_input(name, arr)
            for name in self.output_names:
                binding.bind_output(name, "cuda" if self.device.startswith("cuda") else "cpu")
            self.session.run_with_iobinding(binding)
            return dict(zip(self.output_names, binding.copy_outputs_to_cpu()))
        return dict(zip(self.output_names, self.session.run(self.output_names, feeds)))

    def end_profiling(self) -> str:
        """Stop the runtime's profiler and return the path of its JSON trace."""
        return self.session.end_profiling()


class OrtBackend:
    name = "ort"

    def __init__(self, options: OrtOptions | None = None):
        self.options = options or OrtOptions()

    def devices(self) -> list[str]:
        providers = ort.get_available_providers()
        found = [f"cuda:{i}" for i in range(_cuda_count())]
        found += [name for p, name in _PROVIDER_DEVICES.items() if p in providers]
        return found + ["cpu"]

    def prepare(self, model, *, device: str = "cpu") -> OrtPrepared:
        return OrtPrepared(model, device, self.options)


register_backend("ort", OrtBackend)
