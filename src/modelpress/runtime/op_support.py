"""Which ONNX ops a backend implements, and which of a model's ops it does not.

``SUPPORT_LISTS`` names, per backend, the module that lists its ops (``ops_by_family()``,
``supported_ops()``); the module is imported only when asked, since a backend may need an extra.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import onnx_ir as ir

from modelpress.errors import OptionError
from modelpress.ir import iter_nodes

SUPPORT_LISTS = {"torch": "modelpress.runtime.torch_backend"}


@dataclass(frozen=True)
class OpSupport:
    backend: str
    ops: list[str]  # every op the backend implements
    families: dict[str, list[str]]
    model_ops: list[str] = field(default_factory=list)  # the model's op types, when one was given
    missing: list[str] = field(default_factory=list)  # those the backend does not implement

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def op_support(backend: str, model: ir.Model | None = None) -> OpSupport:
    """The ops ``backend`` implements; with ``model``, its op types and the unsupported ones
    (ops of other domains as ``domain:Op``)."""
    if backend not in SUPPORT_LISTS:
        raise OptionError(
            f"`backend` {backend!r}: no op list (one of {', '.join(sorted(SUPPORT_LISTS))})"
        )
    lister = importlib.import_module(SUPPORT_LISTS[backend])
    supported = list(lister.supported_ops())
    if model is None:
        return OpSupport(backend, supported, lister.ops_by_family())
    used = {
        n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}:{n.op_type}"
        for n in iter_nodes(model.graph)
    }
    return OpSupport(
        backend, supported, lister.ops_by_family(), sorted(used), sorted(used - set(supported))
    )
