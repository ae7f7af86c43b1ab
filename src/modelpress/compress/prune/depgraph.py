"""Dependency groups on an ONNX graph: which channels must be removed together (DepGraph, Fang et
al. 2023, applied to ONNX instead of a ``torch.nn.Module``).

The analysis tracks *units* along one axis of each tensor: a Conv's output channels, a Gemm's or a
weight MatMul's output features. A tracked value has a ``Track(axis, size, units)``: its axis
``axis`` (of length ``size``) is cut into ``units`` contiguous blocks, and removing unit ``u``
removes the block ``[u * block, (u + 1) * block)`` of that axis. Nodes are visited in topological
order and each op's rule (``rules/``) says how units flow from its inputs to its outputs:

- *sources* (Conv, ConvTranspose, Gemm, MatMul with a constant weight) start a new track on their
  output and own the weight rows (and bias entries) of each unit;
- *consumers* of a tracked input own the weight columns that read each unit (a Conv's input
  channels, a Gemm's or MatMul's reduction rows);
- *pass-through* ops (activations, BatchNorm, pooling, Transpose, Reshape, Concat, Split, ...) map
  units to units; ops with per-channel parameters own those parameters' entries;
- ops that *join* tracked values (a residual Add, a Mul of two branches, the Q·Kᵀ product of
  attention) make units equal: a union-find over ``(value, unit)`` keys;
- whatever a rule cannot follow (graph outputs, unknown ops, a reduction over the channels, a
  Reshape that mixes channels with other axes) *blocks* the units it touches.

A *component* (one union-find class) is the smallest removable piece: a channel of a residual
stage, with every weight slice in every layer that reads or writes it; an attention head (its Q,
K and V features, and the output projection's rows); an FFN neuron. The components of coupled
values form a *group* (a layer group); pruning removes a fraction of the components of each group.

Shapes are concrete: the model is run once (``probe``) on a sample of the user's data, and every
rule reads the actual sizes, so Reshapes are followed through their real source and target shapes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from modelpress.ir.graph import copy_model
from modelpress.ir.match import const_array
from modelpress.ir.shapes import ensure_types
from modelpress.runtime.ort import session


@dataclass(frozen=True)
class Track:
    axis: int
    size: int
    units: int

    @property
    def block(self) -> int:
        return self.size // self.units


@dataclass
class Slice:
    """Entries of a node's constant input that belong to the units of ``value``.

    Unit ``u`` owns indices ``[v * block, (v + 1) * block)`` along ``axis``, where ``v`` is ``u``, or
    ``u % modulus`` when the units wrap (a grouped Conv's input channels share weight columns).
    """

    node: ir.Node
    input: int
    axis: int
    value: str
    block: int
    modulus: int | None = None
    role: str = "weight"  # weight, bias, scale, shift, stat, norm

    def indices(self, units: Iterable[int]) -> np.ndarray:
        local = sorted({(u % self.modulus) if self.modulus else u for u in units})
        if not local:
            return np.zeros(0, dtype=np.int64)
        return (np.asarray(local)[:, None] * self.block + np.arange(self.block)[None, :]).reshape(
            -1
        )


@dataclass
class Edit:
    """An attribute or shape constant that follows the kept units of ``value``.

    kinds: ``reshape`` (element ``index`` of the Reshape's target), ``expand`` (element ``index`` of
    Expand's shape), ``split`` (entry ``index`` of Split's sizes), ``group`` (a depthwise Conv's
    ``group`` attribute).
    """

    node: ir.Node
    kind: str
    value: str
    index: int = 0


class UnionFind:
    def __init__(self):
        self.parent: dict = {}

    def find(self, k):
        parent = self.parent
        root = k
        while parent.get(root, root) != root:
            root = parent[root]
        while parent.get(k, k) != root:  # path compression
            parent[k], k = root, parent[k]
        return root

    def union(self, a, b) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


@dataclass
class Group:
    """Coupled values and their removable components (union-find roots), in unit order of the
    first value; ``kind``: channels (Conv), neurons (Gemm/MatMul features) or heads (attention)."""

    index: int
    kind: str
    values: list[str]
    components: list  # removable component ids
    blocked: int  # components that must stay
    sources: list[str]  # names of the nodes whose outputs start the group's tracks

    @property
    def size(self) -> int:
        return len(self.components) + self.blocked

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "units": self.size,
            "prunable": len(self.components),
            "sources": self.sources,
        }


@dataclass
class DepGraph:
    model: ir.Model
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # probed, before pruning
    tracks: dict[str, Track] = field(default_factory=dict)
    slices: list[Slice] = field(default_factory=list)
    edits: list[Edit] = field(default_factory=list)
    uf: UnionFind = field(default_factory=UnionFind)
    blocked_roots: set = field(default_factory=set)
    sources: dict[str, str] = field(default_factory=dict)  # value → node that started its track
    kinds: dict[str, str] = field(default_factory=dict)  # value → channels / neurons / heads
    groups: list[Group] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def component(self, value: str, unit: int):
        return self.uf.find((value, unit))

    def members(self) -> dict:
        """component id → list of (value, unit)."""
        out: dict = {}
        for name, t in self.tracks.items():
            for u in range(t.units):
                out.setdefault(self.uf.find((name, u)), []).append((name, u))
        return out

    def slices_of(self) -> dict:
        """component id → list of (slice, unit)."""
        out: dict = {}
        for s in self.slices:
            for u in range(self.tracks[s.value].units):
                out.setdefault(self.uf.find((s.value, u)), []).append((s, u))
        return out

    def kept_units(self, removed: set) -> dict[str, list[int]]:
        return {
            name: [u for u in range(t.units) if self.uf.find((name, u)) not in removed]
            for name, t in self.tracks.items()
        }


SMALL_INTS = "\0small-ints"  # key of the probed small integer values in the shapes dict


def probe_shapes(model: ir.Model, feeds: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """The concrete shape of every value of the main graph on ``feeds`` (one ONNX Runtime run)."""

    m = copy_model(model)
    ensure_types(m)
    present = {v.name for v in m.graph.outputs}
    for node in m.graph:
        for v in node.outputs:
            # a value whose type inference could not find stays unprobed: its rules block
            if v.name and v.name not in present and v.type is not None:
                m.graph.outputs.append(v)
                present.add(v.name)
    names = [v.name for v in m.graph.outputs]
    sess = session(m, optimize="disabled")
    values = sess.run(names, feeds)
    shapes = {n: tuple(np.shape(a)) for n, a in zip(names, values)}
    # small integer tensors computed at run time (pads, shapes built by exporters), by value
    shapes[SMALL_INTS] = {
        n: np.asarray(a)
        for n, a in zip(names, values)
        if np.asarray(a).dtype.kind in "iu" and np.asarray(a).ndim <= 1 and np.asarray(a).size <= 64
    }
    for name, v in m.graph.initializers.items():
        shapes[name] = tuple(v.const_value.shape)
    for v in m.graph.inputs:
        if v.name in feeds:
            shapes[v.name] = tuple(feeds[v.name].shape)
    return shapes


def param(value: ir.Value | None) -> np.ndarray | None:
    """A constant input: an initializer, a Constant node, or an Identity of either (exporters
    share equal parameters through Identity nodes)."""
    if value is None:
        return None
    array = const_array(value)
    if array is None and value.producer() is not None and value.producer().op_type == "Identity":
        array = const_array(value.producer().inputs[0])
    return array
