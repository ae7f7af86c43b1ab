"""Physical removal: the units of the chosen components leave every weight, bias, statistic and
shape constant that holds them, so the graph is smaller and computes on fewer channels.

``remove(dg, removed)`` edits ``dg.model`` in place. Each constant input that owns slices loses
those entries (``np.delete`` along each axis); an initializer read by that one input is edited
under its own name, one read elsewhere too gets a pruned copy (exporters share equal parameters).
Depthwise ``group`` attributes, Reshape/Expand targets and Split sizes take their new sizes; a
shape tensor built by a Concat gets a new Concat for that consumer alone. Stale intermediate shapes
are dropped (the graph's inputs and outputs keep theirs: blocked, they never change), and nodes and
initializers nothing reads any more are removed.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.compress.prune.depgraph import DepGraph, param
from modelpress.ir.graph import add_initializer, remove_unused_initializers, unique_name
from modelpress.ir.match import const_array


def removed_units(dg: DepGraph, removed: set) -> dict[str, list[int]]:
    out = {}
    for name, t in dg.tracks.items():
        gone = [u for u in range(t.units) if dg.uf.find((name, u)) in removed]
        if gone:
            out[name] = gone
    return out


def remove(dg: DepGraph, removed: set) -> int:
    """Remove the units of the components in ``removed``; returns the parameters removed."""
    graph = dg.model.graph
    gone = removed_units(dg, removed)
    if not gone:
        return 0
    # (node, input) → {axis: indices to delete}
    cuts: dict[tuple[int, int], tuple[ir.Node, int, dict[int, set[int]]]] = {}
    for s in dg.slices:
        units = gone.get(s.value)
        if not units:
            continue
        key = (id(s.node), s.input)
        entry = cuts.setdefault(key, (s.node, s.input, {}))
        entry[2].setdefault(s.axis, set()).update(int(i) for i in s.indices(units))
    before = _param_count(graph)
    made: dict[tuple, ir.Value] = {}
    for node, index, axes in cuts.values():
        value = node.inputs[index]
        array = param(value)
        new = array
        for axis, idx in sorted(axes.items()):
            new = np.delete(new, sorted(idx), axis=axis)
        sig = (value.name, tuple((a, tuple(sorted(i))) for a, i in sorted(axes.items())))
        _set_input(graph, node, index, np.ascontiguousarray(new), made, sig)
    kept = {name: dg.tracks[name].units - len(units) for name, units in gone.items()}
    for e in dg.edits:
        if e.value not in kept:
            continue
        size = kept[e.value] * dg.tracks[e.value].block
        if e.kind == "group":
            e.node.attributes["group"] = ir.AttrInt64("group", size)
        elif e.kind in ("reshape", "expand"):
            _rewrite_shape(graph, e.node, 1, e.index, size, dg.shapes)
        elif e.kind == "split":
            _rewrite_split(graph, e.node, e.index, size)
    for node in graph:
        for out in node.outputs:
            if not out.is_graph_output():
                out.shape = None
    _remove_dead(graph)
    remove_unused_initializers(graph)
    return before - _param_count(graph)


def _param_count(graph: ir.Graph) -> int:
    return sum(
        int(np.prod(v.const_value.shape))
        for v in graph.initializers.values()
        if v.const_value is not None
    )


def _set_input(
    graph: ir.Graph, node: ir.Node, index: int, array: np.ndarray, made: dict, sig: tuple
) -> None:
    value = node.inputs[index]
    sole = (
        value.is_initializer()
        and len(value.uses()) == 1
        and not value.is_graph_input()
        and not value.is_graph_output()
    )
    if sole:
        value.const_value = ir.tensor(array, name=value.name)
        value.shape = ir.Shape(array.shape)
        return
    new = made.get(sig)
    if new is None:
        base = value.name
        if value.producer() is not None and value.producer().op_type == "Identity":
            base = value.producer().inputs[0].name or base
        new = made[sig] = add_initializer(graph, array, f"{base}_pruned")
    node.replace_input_with(index, new)


def _rewrite_shape(
    graph: ir.Graph, node: ir.Node, index: int, element: int, size: int, shapes: dict
) -> None:
    """Set element ``element`` of the shape tensor ``node.inputs[index]`` to ``size``, for ``node``
    alone (a shared constant or Concat is copied, not changed)."""
    value = node.inputs[index]
    array = const_array(value)
    if array is not None:
        new = array.copy().reshape(-1)
        new[element] = size
        node.replace_input_with(
            index, add_initializer(graph, new.reshape(array.shape), "pruned_shape")
        )
        return
    concat = value.producer()
    assert concat is not None and concat.op_type == "Concat", (
        "an edit recorded on a shape it cannot rewrite"
    )
    offset = 0
    inputs = list(concat.inputs)
    for i, piece in enumerate(inputs):
        arr = const_array(piece)
        n = arr.size if arr is not None else int(shapes[piece.name][0])
        if element < offset + n:
            copy = ir.node("Concat", inputs, attributes={"axis": 0})
            graph.insert_before(node, copy)
            copy.outputs[0].type = value.type
            copy.outputs[0].shape = value.shape
            copy.outputs[0].name = _fresh(graph, value.name or "shape")
            node.replace_input_with(index, copy.outputs[0])
            _rewrite_shape(graph, copy, i, element - offset, size, shapes)
            return
        offset += n
    raise AssertionError("shape element out of range")


def _fresh(graph: ir.Graph, hint: str) -> str:

    return unique_name(graph, f"{hint}_pruned")


def _rewrite_split(graph: ir.Graph, node: ir.Node, output: int, size: int) -> None:
    if "split" in node.attributes:
        sizes = list(node.attributes["split"].value)
        sizes[output] = size
        node.attributes["split"] = ir.AttrInt64s("split", sizes)
        return
    array = const_array(node.inputs[1]).copy()
    array[output] = size
    node.replace_input_with(1, add_initializer(graph, array, "pruned_split"))


def _remove_dead(graph: ir.Graph) -> None:
    for node in reversed(list(graph)):
        if all(not (o.uses() or o.is_graph_output()) for o in node.outputs):
            graph.remove(node, safe=True)
