"""The backend contract and registry.

A backend turns a model into something that runs on one device: ``prepare(model, device=...)``
returns a ``Prepared`` whose ``run(feeds)`` maps input names to arrays and returns outputs by name.
Backends are looked up by name (``ort``, ``torch``); the CLI's ``--backend`` choices come from here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import numpy as np

from modelpress.errors import OptionError

if TYPE_CHECKING:  # (the registry is read by the command line's parsers: no onnx_ir for them)
    import onnx_ir as ir


class Prepared(Protocol):
    input_names: list[str]
    output_names: list[str]
    device: str

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


class Backend(Protocol):
    name: str

    def devices(self) -> list[str]:
        """Devices this backend can use on this machine, best first (e.g. ["cuda:0", "cpu"])."""
        ...

    def prepare(self, model: ir.Model, *, device: str = "cpu") -> Prepared: ...


BACKENDS: dict[str, Callable[[], Backend]] = {}

# Built-in backends register themselves when their module is imported; importing lazily keeps
# torch out of the process until someone asks for the torch backend.
_BUILTIN_MODULES = {
    "ort": "modelpress.runtime.ort_backend",
    "torch": "modelpress.runtime.torch_backend",
}


def register_backend(name: str, factory: Callable[[], Backend]) -> None:
    BACKENDS[name] = factory


def backend_names() -> list[str]:
    return sorted(set(BACKENDS) | set(_BUILTIN_MODULES))


def get_backend(name: str) -> Backend:
    if name not in BACKENDS and name in _BUILTIN_MODULES:
        import importlib

        importlib.import_module(_BUILTIN_MODULES[name])
    if name not in BACKENDS:
        raise OptionError(f"unknown backend {name!r}; known backends: {', '.join(backend_names())}")
    return BACKENDS[name]()
