"""The ``torch`` backend: runs an ONNX model as an ``OnnxModule`` on cpu, cuda:N or mps.

``prepare`` builds the module, moves it to the device and (``compile=True``) compiles it with
``torch.compile``; ``run`` takes and returns numpy arrays by name, without autograd.

float32 is computed as float32: on GPUs with TF32 units PyTorch lets cuDNN's convolutions round
their inputs to 10-bit mantissas by default (a ResNet-50 then differs from ONNX Runtime by about
4e-4 of its outputs' scale), so ``run`` turns TF32 off for its call unless the backend was made
with ``TorchBackend(tf32=True)``.
"""

from __future__ import annotations

import contextlib

import numpy as np
import onnx_ir as ir

from modelpress.errors import InputError, OptionError, require


def _torch():
    return require("torch", extra="torch", purpose="the PyTorch backend")


@contextlib.contextmanager
def ieee_fp32(tf32: bool = False):
    """float32 matrix products and convolutions in IEEE float32 on CUDA (TF32 when ``tf32``);
    the process's settings come back afterwards."""
    torch = _torch()
    if tf32 or not torch.cuda.is_available():
        yield
        return
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    matmul.allow_tf32 = False
    try:
        cudnn = torch.backends.cudnn
        with cudnn.flags(
            enabled=cudnn.enabled,
            benchmark=cudnn.benchmark,
            deterministic=cudnn.deterministic,
            allow_tf32=False,
        ):
            yield
    finally:
        matmul.allow_tf32 = before


class TorchPrepared:
    """A model ready to run on one device."""

    def __init__(self, model: ir.Model, *, device: str, compile: bool, tf32: bool = False):
        torch = _torch()
        from modelpress.runtime.torch_backend.module import to_torch
        from modelpress.runtime.torch_backend.registry import from_numpy, to_numpy

        self._from_numpy, self._to_numpy = from_numpy, to_numpy
        self._torch = torch
        self.device = device
        self.tf32 = tf32
        self.module = to_torch(model, device=device, compile=compile)
        self.input_names = list(self.module.input_names)
        self.output_names = list(self.module.output_names)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self._torch
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise InputError(
                f"missing input {missing[0]!r}; the model's inputs: {', '.join(self.input_names)}"
            )
        known = set(self.input_names) | set(self.module.optional_input_names)
        tensors = {}
        for name, array in feeds.items():
            if name not in known:
                raise InputError(
                    f"unknown input {name!r}; the model's inputs: {', '.join(self.input_names)}"
                )
            try:
                tensors[name] = self._from_numpy(array).to(self.device)
            except TypeError as exc:
                raise InputError(
                    f"input {name!r}: {exc}; the PyTorch backend cannot take it"
                ) from None
        with torch.no_grad(), ieee_fp32(self.tf32):
            outputs = self.module(**tensors)  # through __call__, so a compiled forward is used
        if not isinstance(outputs, tuple):
            outputs = (outputs,)
        return {n: self._to_numpy(t) for n, t in zip(self.output_names, outputs, strict=False)}


class TorchBackend:
    """Backend ``torch``: an ONNX graph executed op by op with PyTorch."""

    name = "torch"

    def __init__(self, *, tf32: bool = False):
        """``tf32``: let float32 products and convolutions run on TF32 units (faster on NVIDIA
        Ampere and later, about 1e-3 relative error); off, float32 stays IEEE float32."""
        _torch()
        self.tf32 = tf32

    def devices(self) -> list[str]:
        torch = _torch()
        found = (
            [f"cuda:{i}" for i in range(torch.cuda.device_count())]
            if torch.cuda.is_available()
            else []
        )
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            found.append("mps")
        return found + ["cpu"]

    def prepare(
        self, model: ir.Model, *, device: str = "cpu", compile: bool = False
    ) -> TorchPrepared:
        available = self.devices()
        if device not in available and not (
            device == "cuda" and any(d.startswith("cuda") for d in available)
        ):
            raise OptionError(
                f"device {device!r} is not available to the torch backend; available: {', '.join(available)}"
            )
        return TorchPrepared(model, device=device, compile=compile, tf32=self.tf32)


def ops_by_family() -> dict[str, list[str]]:
    """The supported ops grouped by the kernel module that implements them (conv, linalg, ...)."""
    require("torch", extra="torch", purpose="the PyTorch backend")
    from modelpress.runtime.torch_backend import ops as _ops  # noqa: F401  (registers the kernels)
    from modelpress.runtime.torch_backend.registry import OPS

    families: dict[str, list[str]] = {"shape": ["Constant"]}  # Constant is folded into a buffer
    for (domain, op_type), fn in OPS.items():
        family = fn.__module__.rsplit(".", 1)[-1]
        families.setdefault(family, []).append(op_type if not domain else f"{domain}:{op_type}")
    return {k: sorted(v) for k, v in sorted(families.items())}


def supported_ops() -> list[str]:
    """The ops the PyTorch backend implements (``domain:op`` outside the default domain), sorted."""
    require("torch", extra="torch", purpose="the PyTorch backend")
    from modelpress.runtime.torch_backend import ops as _ops  # noqa: F401  (registers the kernels)
    from modelpress.runtime.torch_backend.registry import OPS

    names = {op_type if not domain else f"{domain}:{op_type}" for domain, op_type in OPS}
    return sorted(names | {"Constant"})
