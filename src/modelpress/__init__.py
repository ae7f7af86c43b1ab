"""modelpress: take a trained model and make it ready for the hardware it will run on.

The Python API uses the same words as the command line: ``load``, ``save``, ``inspect``,
``convert``, ``optimize``, ``verify``, ``quantize``, ``prune``, ``distill``, ``deep_compress``,
``Session`` (run), ``advise``, ``generate`` (an LLM folder). The heavier
entry points load on first use so that ``import modelpress`` stays cheap.
"""

from __future__ import annotations

__version__ = "0.1.0"

# eager: the subpackage `modelpress.convert` would otherwise shadow the function once imported
from modelpress.convert import convert
from modelpress.errors import ModelpressError
from modelpress.ir import graph_stats as inspect
from modelpress.ir import load, save
from modelpress.passes import optimize
from modelpress.verify import verify

_LAZY = {
    "Session": ("modelpress.runtime.session", "Session"),
    "quantize": ("modelpress.compress", "quantize"),
    "prune": ("modelpress.compress.prune.api", "prune"),
    "distill": ("modelpress.compress.distill", "distill"),
    "deep_compress": ("modelpress.compress.deep", "deep_compress"),
    "advise": ("modelpress.advisor", "recommend"),
    "generate": ("modelpress.runtime.generate", "generate"),
    "Generator": ("modelpress.runtime.generate", "Generator"),
}

__all__ = [
    "ModelpressError",
    "__version__",
    "convert",
    "inspect",
    "load",
    "optimize",
    "save",
    "verify",
    *_LAZY,
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'modelpress' has no attribute {name!r}")
