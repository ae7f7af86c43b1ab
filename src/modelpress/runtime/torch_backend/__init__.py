"""The PyTorch backend: any ONNX model as a trainable ``torch.nn.Module``.

``to_torch(model)`` builds an ``OnnxModule`` (initializers become parameters and buffers, the graph
runs node by node with torch ops); ``to_onnx(module)`` writes the trained values back into the
model; ``TorchBackend`` (registered as ``torch``) runs models through the backend contract of
``runtime.backend``. Importing this package does not import torch: the names that need it load
it on first use and a missing torch raises ``MissingExtraError`` naming the extra.
"""

from __future__ import annotations

from modelpress.errors import require
from modelpress.runtime.backend import register_backend
from modelpress.runtime.torch_backend.backend import TorchBackend, ops_by_family, supported_ops
from modelpress.runtime.torch_backend.errors import NodeRunError, UnsupportedOpError

register_backend("torch", TorchBackend)

_LAZY = {
    "to_torch": "modelpress.runtime.torch_backend.module",
    "OnnxModule": "modelpress.runtime.torch_backend.module",
    "to_onnx": "modelpress.runtime.torch_backend.export",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        require("torch", extra="torch", purpose="the PyTorch backend")
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "NodeRunError",
    "OnnxModule",
    "TorchBackend",
    "UnsupportedOpError",
    "ops_by_family",
    "supported_ops",
    "to_onnx",
    "to_torch",
]
