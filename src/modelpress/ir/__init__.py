"""The in-memory model: load and save ONNX files, shapes, and graph statistics.

This layer is the project's one boundary to protobuf: everything else works on ``onnx_ir.Model``.
The names below load their module (and onnx, onnx_ir) on first use, so that ``ir.llm`` and
``ir.files`` serve a process that never touches a graph (``modelpress serve LLM_DIR``).
"""

from __future__ import annotations

from modelpress.errors import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "io": [
            "from_bytes",
            "from_proto",
            "load",
            "load_proto",
            "model_bytes",
            "parse",
            "save",
            "to_proto",
        ],
        "shapes": ["infer_shapes", "parse_shapes"],
        "stats": ["GraphStats", "graph_stats", "iter_nodes"],
    },
)
