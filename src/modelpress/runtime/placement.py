"""Device placement: which node runs where, and the copies that implies.

Every node gets a device: the first pin that matches it (an op type, ``NonMaxSuppression=cpu``, or a
glob on the node name, ``/encoder/*=cuda:0``), else the session's device. Nodes inside If/Loop/Scan
bodies run where their parent runs. A device that is not present becomes the CPU with a warning, or a
``DeviceError`` under strict placement.

Nodes are then cut, in topological order, into segments of one device each. A value produced on one
device and read on another is a copy; graph inputs arrive from the host and graph outputs return
to it, so those count as copies when their segment is not on the CPU.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field

import onnx_ir as ir

from modelpress.errors import OptionError
from modelpress.ir.shapes import infer_shapes
from modelpress.ir.stats import iter_nodes, subgraphs
from modelpress.runtime.devices import choose, normalize

HOST = "cpu"


@dataclass(frozen=True)
class Pin:
    pattern: str
    device: str

    def matches(self, node: ir.Node) -> bool:
        return node.op_type == self.pattern or fnmatch.fnmatchcase(node.name or "", self.pattern)


def parse_pins(specs: list[str] | None) -> list[Pin]:
    """``["NonMaxSuppression=cpu", "/encoder/*=cuda:0"]`` → pins (the last ``=`` splits)."""
    pins = []
    for spec in specs or []:
        pattern, sep, device = spec.rpartition("=")
        if not sep or not pattern or not device:
            raise OptionError(
                f"`place` {spec!r}: expected PATTERN=DEVICE, e.g. NonMaxSuppression=cpu"
            )
        pins.append(Pin(pattern, normalize(device)))
    return pins


@dataclass(frozen=True)
class Copy:
    value: str
    src: str
    dst: str
    nbytes: int | None  # None when the shape is not static


@dataclass
class Segment:
    device: str
    nodes: list[str]
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)


@dataclass
class PlacementPlan:
    assignments: list[tuple[str, str, str]]  # (node name, op type, device)
    segments: list[Segment]
    copies: list[Copy]
    warnings: list[str]

    @property
    def devices(self) -> list[str]:
        return sorted({s.device for s in self.segments})

    def log_lines(self) -> list[str]:
        lines = [f"{name or '<unnamed>'} ({op}) -> {dev}" for name, op, dev in self.assignments]
        for c in self.copies:
            size = "?" if c.nbytes is None else f"{c.nbytes} B"
            lines.append(f"copy {c.value}: {c.src} -> {c.dst} ({size})")
        lines.append(f"{len(self.segments)} segment(s), {len(self.copies)} copie(s)")
        return lines


def _nbytes(value: ir.Value) -> int | None:
    if value.shape is None or value.dtype is None:
        return None
    dims = list(value.shape)
    if not all(isinstance(d, int) for d in dims):
        return None
    return int(math.prod(dims) * value.dtype.itemsize)


def _reads(node: ir.Node, graph: ir.Graph) -> list[ir.Value]:
    """The values of ``graph`` that ``node`` reads: its inputs, and those its subgraphs capture."""
    values = [v for v in node.inputs if v is not None]
    for sub in subgraphs(node):
        for inner in iter_nodes(sub):
            for v in inner.inputs:
                if v is not None and v.graph is graph:
                    values.append(v)
                elif (
                    v is not None
                    and v.graph is None
                    and v.producer() is not None
                    and v.producer().graph is graph
                ):
                    values.append(v)
    return values


def plan(
    model: ir.Model,
    *,
    device: str,
    available: list[str],
    pins: list[Pin] | None = None,
    strict: bool = False,
    backend: str = "",
) -> PlacementPlan:
    """Assign nodes of ``model`` (main graph) to devices and cut the graph into segments."""

    # Sizes of the copies need shapes of intermediate values, inferred on a copy of the model, and
    # only when there is a copy: symbolic inference can take seconds (a detector's Resize chain).
    shaped: dict[str, ir.Value] | None = None

    def copy_bytes(v: ir.Value) -> int:
        nonlocal shaped
        if shaped is None:
            shaped = {o.name: o for n in infer_shapes(model).graph for o in n.outputs}
        return _nbytes(shaped.get(v.name, v))

    warnings: list[str] = []
    resolved: dict[str, str] = {}

    def resolve(dev: str) -> str:
        if dev not in resolved:
            choice = choose(dev, available, strict=strict, backend=backend)
            if choice.warning:
                warnings.append(choice.warning)
            resolved[dev] = choice.device
        return resolved[dev]

    default = resolve(device)
    assignments = []
    node_device: dict[int, str] = {}
    for node in model.graph:
        dev = default
        for pin in pins or []:
            if pin.matches(node):
                dev = resolve(pin.device)
                break
        node_device[id(node)] = dev
        assignments.append((node.name or "", node.op_type, dev))

    segments: list[Segment] = []
    seg_of: dict[int, int] = {}
    for node in model.graph:
        dev = node_device[id(node)]
        if not segments or segments[-1].device != dev:
            segments.append(Segment(dev, []))
        segments[-1].nodes.append(node.name or "")
        seg_of[id(node)] = len(segments) - 1

    copies: list[Copy] = []
    graph_outputs = {id(v) for v in model.graph.outputs}
    for node in model.graph:
        si = seg_of[id(node)]
        seg = segments[si]
        for v in _reads(node, model.graph):
            if v.name in seg.inputs or (v.const_value is not None and not v.is_graph_input()):
                continue
            producer = v.producer()
            src = segments[seg_of[id(producer)]].device if producer is not None else HOST
            if producer is not None and seg_of[id(producer)] == si:
                continue
            seg.inputs.append(v.name)
            if src != seg.device:
                copies.append(Copy(v.name, src, seg.device, copy_bytes(v)))
        for v in node.outputs:
            used_outside = any(seg_of.get(id(user)) != si for user, _ in v.uses())
            if used_outside or id(v) in graph_outputs:
                seg.outputs.append(v.name)
                if id(v) in graph_outputs and seg.device != HOST:
                    copies.append(Copy(v.name, seg.device, HOST, copy_bytes(v)))
    return PlacementPlan(assignments, segments, copies, warnings)


def segment_model(model: ir.Model, segment: Segment) -> ir.Model:
    """A standalone model computing ``segment`` from its inputs (initializers included)."""
    graph = ir.convenience.extract(model.graph, segment.inputs, segment.outputs)
    for domain, version in model.opset_imports.items():
        graph.opset_imports.setdefault(domain, version)
    return ir.Model(graph, ir_version=model.ir_version, functions=list(model.functions.values()))
