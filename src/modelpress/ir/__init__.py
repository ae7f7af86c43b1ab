"""The in-memory model: load and save ONNX files, shapes, and graph statistics.

This layer is the project's one boundary to protobuf: everything else works on ``onnx_ir.Model``.
"""

from modelpress.ir.io import load, load_proto, save, to_proto, from_proto, model_bytes
from modelpress.ir.shapes import parse_shapes, infer_shapes
from modelpress.ir.stats import GraphStats, graph_stats, iter_nodes

__all__ = [
    "GraphStats",
    "from_proto",
    "graph_stats",
    "infer_shapes",
    "iter_nodes",
    "load",
    "load_proto",
    "model_bytes",
    "parse_shapes",
    "save",
    "to_proto",
]
