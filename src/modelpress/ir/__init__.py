"""The in-memory model: load and save ONNX files, shapes, and graph statistics.

This layer is the project's one boundary to protobuf: everything else works on ``onnx_ir.Model``.
The names below load their module (and onnx, onnx_ir) on first use, so that ``ir.llm`` and
``ir.files`` serve a process that never touches a graph (``modelpress serve LLM_DIR``).
"""

from __future__ import annotations

from modelpress.errors import lazy_exports

_LAZY = {
    "from_bytes": "modelpress.ir.io",
    "from_proto": "modelpress.ir.io",
    "load": "modelpress.ir.io",
    "load_proto": "modelpress.ir.io",
    "model_bytes": "modelpress.ir.io",
    "parse": "modelpress.ir.io",
    "save": "modelpress.ir.io",
    "to_proto": "modelpress.ir.io",
    "infer_shapes": "modelpress.ir.shapes",
    "parse_shapes": "modelpress.ir.shapes",
    "GraphStats": "modelpress.ir.stats",
    "graph_stats": "modelpress.ir.stats",
    "iter_nodes": "modelpress.ir.stats",
}

__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
