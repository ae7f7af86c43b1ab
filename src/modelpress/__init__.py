"""modelpress: take a trained model and make it ready for the hardware it will run on.

The Python API uses the same words as the command line: ``load``, ``save``, ``inspect``,
``optimize``, ``verify``. Submodules load lazily so that ``import modelpress`` stays cheap.
"""

from __future__ import annotations

__version__ = "0.1.0"

from modelpress.errors import ModelpressError
from modelpress.ir import graph_stats as inspect
from modelpress.ir import load, save
from modelpress.passes import optimize
from modelpress.verify import verify

__all__ = ["ModelpressError", "__version__", "inspect", "load", "optimize", "save", "verify"]


def __getattr__(name: str):
    # Heavier entry points load on first use so that `import modelpress` stays cheap.
    if name == "Session":
        from modelpress.runtime.session import Session

        return Session
    raise AttributeError(f"module 'modelpress' has no attribute {name!r}")
