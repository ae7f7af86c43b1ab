"""The backend contract and registry.

A backend turns a model into something that runs on one device: ``prepare(model, device=...)``
returns a ``Prepared`` whose ``run(feeds)`` maps input names to arrays and returns outputs by name.
Backends are looked up by name (``ort``, ``torch``); the CLI's ``--backend`` choices come from here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import onnx_ir as ir

from modelpress.errors import OptionError


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


def register_backend(name: str, factory: Callable[[], Backend]) -> None:
    BACKENDS[name] = factory


def get_backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise OptionError(f"unknown backend {name!r}; known backends: {', '.join(sorted(BACKENDS))}")
    return BACKENDS[name]()
