"""The walk of the dependency analysis: the helpers rules call (the registry is ``registry.py``), and the
grouping of coupled values (see ``depgraph.py`` for the model, ``rules/`` for each op's rule).

A rule reads its node's inputs' tracks and concrete shapes, gives its outputs tracks, joins units
that must be removed together, and records the constant entries (``Slice``) and shape constants
(``Edit``) each unit owns. A rule that cannot follow its input raises ``Refuse``: every unit of its
tracked inputs is then blocked (kept), which is always safe. Ops without a rule block too.
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx_ir as ir

from modelpress.compress.prune import rules  # noqa: F401  (registers the op rules)
from modelpress.compress.prune.depgraph import DepGraph, Edit, Group, Slice, Track, param
from modelpress.compress.prune.registry import RULES, Refuse

SOURCES = {"Conv", "ConvTranspose", "Gemm", "MatMul"}


class Analyzer:
    def __init__(self, model: ir.Model, shapes: dict[str, tuple[int, ...]]):
        self.g = DepGraph(model, shapes)
        self.model = model
        self.shapes = shapes
        self.blocked_keys: set = set()

    # helpers for the rules -------------------------------------------------------------------
    def shape(self, v: ir.Value | None) -> tuple[int, ...]:
        if v is None:
            raise Refuse
        if v.name in self.shapes:
            return self.shapes[v.name]
        array = param(v)
        if array is not None:
            return tuple(array.shape)
        raise Refuse

    def track(self, v: ir.Value | None) -> Track | None:
        return None if v is None else self.g.tracks.get(v.name)

    def new(
        self,
        v: ir.Value,
        axis: int,
        units: int,
        *,
        source: ir.Node | None = None,
        kind: str | None = None,
    ) -> Track:
        size = self.shape(v)[axis]
        if units < 1 or size % units:
            raise Refuse
        t = Track(axis, size, units)
        self.g.tracks[v.name] = t
        if source is not None:
            self.g.sources[v.name] = source.name or source.op_type
        if kind is not None:
            self.g.kinds[v.name] = kind
        return t

    def link(self, a: ir.Value, b: ir.Value) -> None:
        ta, tb = self.g.tracks[a.name], self.g.tracks[b.name]
        if ta.units != tb.units:
            raise Refuse
        for u in range(ta.units):
            self.g.uf.union((a.name, u), (b.name, u))
        kind = self.g.kinds.get(a.name) or self.g.kinds.get(b.name)
        if kind == "heads":
            self.g.kinds[a.name] = self.g.kinds[b.name] = kind

    def slice(
        self,
        node: ir.Node,
        index: int,
        axis: int,
        value: ir.Value,
        role: str,
        *,
        modulus: int | None = None,
    ) -> None:
        array = param(node.inputs[index])
        if array is None:
            raise Refuse
        t = self.g.tracks[value.name]
        axis = axis + array.ndim if axis < 0 else axis
        n = modulus or t.units
        if array.shape[axis] % n:
            raise Refuse
        self.g.slices.append(
            Slice(node, index, axis, value.name, array.shape[axis] // n, modulus, role)
        )

    def edit(self, node: ir.Node, kind: str, value: ir.Value, index: int = 0) -> None:
        self.g.edits.append(Edit(node, kind, value.name, index))

    def block(self, name: str) -> None:
        t = self.g.tracks.get(name)
        if t is not None:
            self.blocked_keys.update((name, u) for u in range(t.units))

    # the walk -------------------------------------------------------------------------------
    def run(self, keep: set[str]) -> DepGraph:
        graph = self.model.graph
        for node in graph:
            std = node.domain in ("", "ai.onnx")
            tracked = [v for v in node.inputs if v is not None and v.name in self.g.tracks]
            for attr in node.attributes.values():
                if attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
                    self._block_captured(attr)
            if not tracked and not (std and node.op_type in SOURCES):
                continue
            fn = RULES.get(node.op_type) if std else None
            before = len(self.g.slices), len(self.g.edits)
            try:
                if fn is None:
                    raise Refuse
                fn(self, node)
            except Refuse:
                del self.g.slices[before[0] :]
                del self.g.edits[before[1] :]
                for v in node.outputs:
                    if v.name in self.g.tracks and v.name not in {t.name for t in tracked}:
                        del self.g.tracks[v.name]
                for v in tracked:
                    self.block(v.name)
        for v in graph.outputs:
            self.block(v.name)
        for s in self.g.slices:
            if s.node.name in keep:
                self.block(s.value)
        self.g.blocked_roots = {self.g.uf.find(k) for k in self.blocked_keys}
        self._groups()
        return self.g

    def _block_captured(self, attr: ir.Attr) -> None:
        graphs = [attr.value] if attr.type == ir.AttributeType.GRAPH else list(attr.value)
        for sub in graphs:
            for node in ir.traversal.RecursiveGraphIterator(sub):
                for v in node.inputs:
                    if v is not None and v.name in self.g.tracks:
                        self.block(v.name)

    def _groups(self) -> None:
        g = self.g
        # values are coupled when any of their units share a component
        root_values: dict = {}
        for name, t in g.tracks.items():
            for u in range(t.units):
                root_values.setdefault(g.uf.find((name, u)), set()).add(name)
        vf = _Sets()
        for names in root_values.values():
            first = next(iter(names))
            for n in names:
                vf.union(first, n)
        by_group: dict = {}
        for name in g.tracks:
            by_group.setdefault(vf.find(name), []).append(name)
        for values in by_group.values():
            roots: list = []
            seen = set()
            first = values[0]
            ordered = [first] + [v for v in values if v != first]
            for name in ordered:
                for u in range(g.tracks[name].units):
                    r = g.uf.find((name, u))
                    if r not in seen:
                        seen.add(r)
                        roots.append(r)
            members = set(values)
            has_slice = {
                g.uf.find((s.value, u))
                for s in g.slices
                if s.value in members
                for u in range(g.tracks[s.value].units)
            }
            prunable = [r for r in roots if r not in g.blocked_roots and r in has_slice]
            kinds = {g.kinds.get(v) for v in values}
            kind = (
                "heads" if "heads" in kinds else ("channels" if "channels" in kinds else "neurons")
            )
            sources = sorted({g.sources[v] for v in values if v in g.sources})
            if not sources:
                continue
            g.groups.append(
                Group(len(g.groups), kind, values, prunable, len(roots) - len(prunable), sources)
            )


class _Sets:
    def __init__(self):
        self.p: dict = {}

    def find(self, k):
        while self.p.get(k, k) != k:
            self.p[k] = self.p.get(self.p[k], self.p[k])
            k = self.p[k]
        return k

    def union(self, a, b):
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.p[ra] = rb


def analyze(
    model: ir.Model, shapes: dict[str, tuple[int, ...]], *, keep: Iterable[str] = ()
) -> DepGraph:
    """The dependency graph of ``model`` with every value's concrete shape in ``shapes``.

    ``keep``: node names whose weights must stay whole (their components are blocked).
    """
    return Analyzer(model, shapes).run(set(keep))
