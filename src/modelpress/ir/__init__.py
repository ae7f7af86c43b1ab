"""The in-memory model: load and save ONNX files, shapes, and graph statistics.

This layer is the project's one boundary to protobuf: everything else works on ``onnx_ir.Model``.
"""

from modelpress.ir.io import (
    from_bytes,
    from_proto,
    load,
    load_proto,
    model_bytes,
    parse,
    save,
    to_proto,
)
from modelpress.ir.shapes import infer_shapes, parse_shapes
from modelpress.ir.stats import GraphStats, graph_stats, iter_nodes

__all__ = [
    "GraphStats",
    "from_bytes",
    "from_proto",
    "graph_stats",
    "infer_shapes",
    "iter_nodes",
    "load",
    "load_proto",
    "model_bytes",
    "parse",
    "parse_shapes",
    "save",
    "to_proto",
]
