"""ONNX Runtime sessions: the one place that builds them.

``session()`` takes a model in any form modelpress handles (path, ``onnx_ir.Model``, ``ModelProto``,
serialized bytes) and the options under clear names. ``use_global_thread_pool()`` makes every later
session share one process-wide pool: when several sessions are timed in one process, per-session
spinning pools fight over the cores and inflate each other's latency.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnxruntime as ort

from modelpress.errors import ModelLoadError
from modelpress.ir import model_bytes

OPT_LEVELS = {
    "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}

_global_pool = False


def use_global_thread_pool(intra_op_threads: int = 0, inter_op_threads: int = 1) -> None:
    """Create (once per process) the shared thread pool that sessions made afterwards will use."""
    global _global_pool
    if not _global_pool:
        from onnxruntime.capi import _pybind_state

        _pybind_state.set_global_thread_pool_sizes(intra_op_threads, inter_op_threads)
        _global_pool = True


def session_options(
    *,
    optimize: str = "all",
    intra_op_threads: int | None = None,
    inter_op_threads: int | None = None,
    parallel: bool = False,
    profile: bool = False,
) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.graph_optimization_level = OPT_LEVELS[optimize]
    # Fatal only: a failed run raises, and its caller reports it as one line; ONNX Runtime's own
    # error log would print the same failure again, in colour, before it.
    so.log_severity_level = 4
    if _global_pool:
        so.use_per_session_threads = False
    else:
        if intra_op_threads is not None:
            so.intra_op_num_threads = intra_op_threads
        if inter_op_threads is not None:
            so.inter_op_num_threads = inter_op_threads
    so.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL if parallel else ort.ExecutionMode.ORT_SEQUENTIAL
    )
    so.enable_profiling = profile
    return so


def session(
    model,
    *,
    optimize: str = "all",
    providers: list[str] | None = None,
    options: ort.SessionOptions | None = None,
) -> ort.InferenceSession:
    """An ``InferenceSession`` for ``model`` (path, onnx_ir.Model, ModelProto or bytes)."""
    so = options or session_options(optimize=optimize)
    providers = providers or ["CPUExecutionProvider"]
    if isinstance(model, (str, os.PathLike)):
        source: str | bytes = str(Path(model))
    elif isinstance(model, bytes):
        source = model
    else:
        source = model_bytes(model)
    try:
        return ort.InferenceSession(source, sess_options=so, providers=providers)
    except Exception as exc:  # ORT raises its own exception classes for bad graphs
        msg = str(exc).strip().splitlines()[0][:400] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"ONNX Runtime cannot load the model: {msg}") from None
