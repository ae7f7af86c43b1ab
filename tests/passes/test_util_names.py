"""New constants get names no other value or node has, also inside a bulk edit."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.ir.graph import add_initializer, bulk_names, reserve


def _graph() -> ir.Graph:
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    node = ir.node("Relu", [x], name="w")
    node.outputs[0].name = "w_1"
    return ir.Graph([x], [node.outputs[0]], nodes=[node], name="g")


def test_add_initializer_avoids_taken_names():
    g = _graph()
    a = add_initializer(g, np.zeros(2, np.float32), "w")  # "w" is a node's name
    b = add_initializer(g, np.zeros(2, np.float32), "w")
    assert {a.name, b.name}.isdisjoint({"w", "w_1", "x"}) and a.name != b.name


def test_bulk_edit_sees_its_own_names_and_reserved_ones():
    g = _graph()
    with bulk_names(g):
        a = add_initializer(g, np.zeros(2, np.float32), "c")
        node = ir.node("Neg", [g.inputs[0]], name="by_hand")
        node.outputs[0].name = "c_2"
        g.append(node)
        reserve(g, "by_hand", "c_2")
        b = add_initializer(g, np.zeros(2, np.float32), "c")
        c = add_initializer(g, np.zeros(2, np.float32), "c")
    names = [a.name, b.name, c.name, "c_2"]
    assert len(set(names)) == 4
    # after the block, a fresh scan again
    d = add_initializer(g, np.zeros(2, np.float32), "c")
    assert d.name not in names
