"""What a declaration is checked against: the model's inputs and outputs, with each dimension
either a fixed size or ``None`` (dynamic: a name, empty, -1 or 0, as ``ir.shapes.static_dim``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from modelpress.ir.feeds import numpy_dtype
from modelpress.ir.shapes import static_dim
from modelpress.runtime.processing.fields import convert_fields, fail


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: np.dtype
    dims: tuple[int | None, ...] | None  # None: rank unknown

    @property
    def rank(self) -> int | None:
        return None if self.dims is None else len(self.dims)

    def describe(self) -> str:
        if self.dims is None:
            return f"{self.name!r} ({self.dtype}, any shape)"
        dims = ", ".join("?" if d is None else str(d) for d in self.dims)
        return f"{self.name!r} ({self.dtype} [{dims}])"


def _tensor(value: ir.Value) -> Tensor:
    dims = None if value.shape is None else tuple(static_dim(d) for d in value.shape)
    return Tensor(value.name, numpy_dtype(value), dims)


def inputs(model: ir.Model) -> list[Tensor]:
    """The inputs a caller feeds (initializers listed as inputs are left out)."""
    g = model.graph
    return [_tensor(v) for v in g.inputs if v.name not in g.initializers]


def outputs(model: ir.Model) -> list[Tensor]:
    return [_tensor(v) for v in model.graph.outputs]


def pick_input(name: str | None, model_inputs: list[Tensor], *, kind: str) -> Tensor:
    """The input ``pre.input`` names, or the model's only input."""
    names = ", ".join(t.name for t in model_inputs)
    if name is not None:
        for t in model_inputs:
            if t.name == name:
                return t
        raise fail("pre.input", f"the model has no input {name!r} (inputs: {names})")
    if len(model_inputs) != 1:
        raise fail(
            "pre.input", f"the model has {len(model_inputs)} inputs ({names}); name the {kind} one"
        )
    return model_inputs[0]


def one_input(
    raw: dict, keys: dict, model_inputs: list[Tensor], *, kind: str
) -> tuple[dict, Tensor]:
    """The fields of a pre-processing that feeds one input: ``raw`` converted by ``keys``, and the
    model input they name (``input``; by default the model's only one)."""
    f = convert_fields(raw, keys, where="pre")
    return f, pick_input(f.get("input"), model_inputs, kind=kind)
