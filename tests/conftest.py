"""Shared test helpers: models from ONNX text, running them, comparing against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from modelpress.ir import from_proto


def model_from_text(text: str) -> ir.Model:
    """An ``onnx_ir.Model`` from ONNX text format (checked by the ONNX checker)."""
    proto = onnx.parser.parse_model(text)
    onnx.checker.check_model(proto)
    return from_proto(proto)


def node_ops(model: ir.Model) -> list[str]:
    return [n.op_type for n in model.graph]


@pytest.fixture
def rng():
    return np.random.default_rng(0)
