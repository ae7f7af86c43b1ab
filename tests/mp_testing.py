"""Helpers shared by the tests: models from ONNX text format.

Tests import this module by name (``from mp_testing import model_from_text``); pyproject puts
``tests/`` on the path. It is not a conftest so that per-folder conftest files cannot shadow it.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir

from modelpress.ir import from_proto


def model_from_text(text: str) -> ir.Model:
    """An ``onnx_ir.Model`` from ONNX text format (checked by the ONNX checker)."""
    proto = onnx.parser.parse_model(text)
    onnx.checker.check_model(proto)
    return from_proto(proto)


def node_ops(model: ir.Model) -> list[str]:
    return [n.op_type for n in model.graph]


def structure(model) -> list[tuple]:
    """Each node as (op, inputs), inputs named by graph input, 'const', or (producer index, slot)."""
    graph = model.graph
    index = {node: i for i, node in enumerate(graph)}
    consts = set(graph.initializers.values())

    def ref(v):
        if v is None:
            return None
        if v in consts:
            return "const"
        if v.producer() is None:
            return v.name
        return (index[v.producer()], v.index())

    return [(n.op_type, [ref(v) for v in n.inputs]) for n in graph] + [
        ("out", [ref(v) for v in graph.outputs])
    ]
