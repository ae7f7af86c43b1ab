"""Names: every node, value, initializer, graph and function name becomes a meaningless unique
token, and everything else that could carry a name or a hint (doc strings, metadata, producer,
the shapes of intermediate values) is cleared.

The rule: a name is a random 8-character token drawn from the seeded generator, unique in the
model, and different from every name of the original model (so no original string can survive
by chance). The graph's inputs and outputs keep their names by default: they are the model's
interface, and callers feed and read them by name (``rename_io`` renames them too). Shapes of
intermediate values go (they would give away channel counts and sequence lengths); the interface
keeps its types and shapes.
"""

from __future__ import annotations

import string

import numpy as np
import onnx_ir as ir

from modelpress.ir.stats import all_graphs

_ALPHABET = np.array(list(string.ascii_lowercase + string.digits))


class Namer:
    """Random unique tokens, avoiding ``avoid`` (the original names)."""

    def __init__(self, rng: np.random.Generator, avoid: set[str]):
        self.rng = rng
        self.taken = set(avoid)

    def __call__(self) -> str:
        while True:
            token = "".join(self.rng.choice(_ALPHABET, size=8))
            if token[0].isalpha() and token not in self.taken:
                self.taken.add(token)
                return token


def all_names(model: ir.Model) -> set[str]:
    """Every name string in ``model``: values, nodes, graphs, functions, metadata keys and values."""
    names: set[str] = set()
    for graph in all_graphs(model):
        names.add(graph.name or "")
        for v in [*graph.inputs, *graph.outputs, *graph.initializers.values()]:
            names.add(v.name or "")
        for node in graph:
            names.add(node.name or "")
            names.update(v.name or "" for v in node.outputs)
    for f in model.functions.values():
        names.update((f.name, f.domain))
    names.update(model.metadata_props)
    names.update(model.metadata_props.values())
    names.discard("")
    return names


def _clear(item) -> None:
    item.doc_string = None
    item.metadata_props.clear()


def rename(model: ir.Model, namer: Namer, *, rename_io: bool) -> dict[str, str]:
    """Rename everything in ``model`` in place; returns ``{new: old}`` for the interface names
    that were renamed (empty unless ``rename_io``)."""
    main = model.graph
    interface = {*main.inputs, *main.outputs}
    io_map: dict[str, str] = {}
    done: set[ir.Value] = set()  # a value read by a nested graph is met twice; rename it once

    def value_(value: ir.Value, visible: bool) -> None:
        if value in done:
            return
        done.add(value)
        _clear(value)
        if value in interface:
            if rename_io and value.name:
                new = namer()
                io_map[new] = value.name
                value.name = new
            return
        value.name = namer()
        if visible:  # an initializer's tensor carries its own type and shape
            value.type = None
            value.shape = None

    for graph in list(all_graphs(model)):
        visible = graph is main  # shapes inside the (encrypted) library may stay
        graph.name = namer()
        _clear(graph)
        for value in [*graph.inputs, *graph.initializers.values()]:
            value_(value, visible)
        for node in graph:
            node.name = namer()
            _clear(node)
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.TENSOR and attr.value.name:
                    attr.value.name = None  # a Constant's tensor keeps its initializer's name
            for value in node.outputs:
                value_(value, visible)
        for value in graph.outputs:
            value_(value, visible)
    model.doc_string = None
    model.metadata_props.clear()
    model.producer_name = "modelpress"
    model.producer_version = None
    model.domain = None
    model.model_version = None
    for f in model.functions.values():
        _clear(f)
    return io_map
