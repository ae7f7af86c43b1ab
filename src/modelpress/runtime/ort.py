"""ONNX Runtime sessions: the one place that builds them.

``session()`` takes a model in any form modelpress handles (path, ``onnx_ir.Model``, ``ModelProto``,
serialized bytes) and the options under clear names. ``use_global_thread_pool()`` makes every later
session share one process-wide pool: when several sessions are timed in one process, per-session
spinning pools fight over the cores and inflate each other's latency.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from modelpress.errors import ModelLoadError

if TYPE_CHECKING:
    import onnx_ir as ir

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


LEND_BYTES = 16 << 20  # models with more initializer bytes than this lend them to the session
_LEND_MIN = 1 << 20
_LENT_LOCATION = "modelpress-lent-initializer"
_LENDABLE = {"float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool"}


def _lent(model: ir.Model, so: ort.SessionOptions, lend_bytes: int) -> tuple[bytes, list]:
    """The model's bytes, its big initializers left out and lent to the session instead
    (``add_external_initializers``: ONNX Runtime reads the arrays where they are, on the CPU), so
    a big model in memory is not held twice more (serialized, then parsed); small models and
    initializers that are also inputs (overridable) go in the bytes as usual."""
    import onnx_ir as ir

    from modelpress.ir.io import model_bytes

    graph = model.graph
    big = [
        v
        for v in graph.initializers.values()
        if v.const_value is not None
        and (v.const_value.nbytes >= _LEND_MIN or isinstance(v.const_value, ir.ExternalTensor))
        and not v.is_graph_input()
        and v.const_value.dtype.numpy().name in _LENDABLE
    ]
    folders = {
        str(v.const_value.base_dir)
        for v in graph.initializers.values()
        if isinstance(v.const_value, ir.ExternalTensor)
    }
    if len(folders) == 1 and "" not in folders:
        # a model read lazily from one folder: ONNX Runtime reads its external data itself (the
        # bytes keep the references; the folder is named in the options), once; lent, the
        # arrays mapped from the files would be copied again
        so.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", folders.pop()
        )
        big = [v for v in big if not isinstance(v.const_value, ir.ExternalTensor)]
    on_disk = any(isinstance(v.const_value, ir.ExternalTensor) for v in big)
    if sum(v.const_value.nbytes for v in big) < lend_bytes and not on_disk:
        return model_bytes(model), []  # (a model read lazily is lent: bytes cannot point at files)
    arrays = [np.ascontiguousarray(v.const_value.numpy()) for v in big]
    saved = [v.const_value for v in big]
    try:
        for v, a in zip(big, arrays):
            v.const_value = ir.ExternalTensor(
                _LENT_LOCATION,
                0,
                a.nbytes,
                v.const_value.dtype,
                shape=v.const_value.shape,
                name=v.name,
            )
        data = model_bytes(model)
    finally:
        for v, t in zip(big, saved):
            v.const_value = t
    values = [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays]
    so.add_external_initializers([v.name for v in big], values)
    return data, [arrays, values]


def session(
    model,
    *,
    optimize: str = "all",
    providers: list[str] | None = None,
    options: ort.SessionOptions | None = None,
    lend_bytes: int | None = None,
) -> ort.InferenceSession:
    """An ``InferenceSession`` for ``model`` (path, onnx_ir.Model, ModelProto or bytes).

    ``lend_bytes``: an ``onnx_ir.Model`` with at least this many bytes of large initializers
    (default ``LEND_BYTES``) lends them to the session instead of serializing them (0: always; the bytes and ONNX
    Runtime's parse of them cost about 3x the weights at the session's creation)."""
    so = options or session_options(optimize=optimize)
    providers = providers or ["CPUExecutionProvider"]
    keep: list = []
    if isinstance(model, (str, os.PathLike)):
        source: str | bytes = str(Path(model))  # (a file: onnx and onnx_ir stay unimported)
    elif isinstance(model, bytes):
        source = model
    else:
        import onnx_ir as ir

        from modelpress.ir.io import model_bytes

        if isinstance(model, ir.Model):
            source, keep = _lent(model, so, LEND_BYTES if lend_bytes is None else lend_bytes)
        else:
            source = model_bytes(model)
    try:
        sess = ort.InferenceSession(source, sess_options=so, providers=providers)
        sess._modelpress_lent = keep  # ONNX Runtime reads those arrays for the session's life
        return sess
    except Exception as exc:  # ORT raises its own exception classes for bad graphs
        msg = str(exc).strip().splitlines()[0][:400] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"ONNX Runtime cannot load the model: {msg}") from None
