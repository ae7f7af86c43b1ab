"""Level 3, ONNX Runtime as the target: persist ONNX Runtime's own graph optimizations.

The rewrite: the model is handed to ONNX Runtime's offline optimizer (``SessionOptions.
optimized_model_filepath``), which applies every ORT graph transformer of the chosen level
(constant folding, Conv/MatMul/Gemm + activation fusions, LayerNorm/Attention/GELU/SkipLayerNorm
into ``com.microsoft`` contrib ops, and at level ``all`` the NCHWc layout of the CPU execution
provider), and the optimized file is loaded back into the IR. A session then loads it with graph
optimizations disabled and skips that work at load time.

Legal only for ONNX Runtime (the contrib ops exist nowhere else), hence level 3 and non-standard:
``optimize()`` marks the output's metadata ``modelpress.target_runtime = onnxruntime`` and this pass
adds ``modelpress.onnxruntime_optimization`` with the ORT version and level. At level ``all`` the
NCHWc layout is chosen for this machine's vector width (AVX2 or AVX-512 block size), so the file
is tied to CPUs with the same instruction set; ``extended`` output is portable across CPUs. Both
are made for ORT's CPU execution provider (the NCHWc ops exist only there). ``all`` is the default
because only it keeps the speed: reloaded with optimizations disabled, ``all`` output runs as fast
as the original under ORT fully enabled, while ``extended`` output of a CNN stays clearly slower
(the NCHWc convolution kernels are most of ORT's CNN speed).

The pass runs again only when other passes changed the graph since its last run (a round of
``optimize()`` after it), and counts its rewrites as the difference between the op histograms
before and after (0, and the model left as it was, when ORT found nothing to change). When ORT's
optimizer fails, or writes a model ORT itself cannot load, the model stays as it was and the
debug log says why.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import onnx_ir as ir
import onnxruntime
from onnx_ir.passes import PassResult

from modelpress.errors import ModelLoadError
from modelpress.ir.io import load, save
from modelpress.ir.stats import iter_graphs, iter_nodes
from modelpress.passes.base import GraphPass
from modelpress.runtime.ort import session, session_options

METADATA_KEY = "modelpress.onnxruntime_optimization"


def _histogram(model: ir.Model) -> Counter[tuple[str, str]]:
    return Counter((n.domain, n.op_type) for n in iter_nodes(model.graph))


def _signature(model: ir.Model) -> tuple:
    """The graph's structure by names: changes whenever a pass adds, removes or rewires a node.

    Names, not object identities: a pass that re-creates the same graph (shape inference does, by
    a round trip through protobuf) has changed nothing ORT would see.
    """
    nodes = tuple(
        (n.domain, n.op_type, tuple(v.name if v is not None else "" for v in n.inputs))
        for n in iter_nodes(model.graph)
    )
    inits = tuple(name for g in iter_graphs(model.graph) for name in g.initializers)
    return nodes, inits, tuple(v.name for v in model.graph.outputs)


def ort_optimize(model: ir.Model, *, level: str, external_data: bool | None = None) -> ir.Model:
    """``model`` as ONNX Runtime's offline optimizer writes it at ``level`` (a new model).

    Works in a temporary folder. Models over the protobuf limit (or any, with ``external_data``)
    travel with their weights in external data files, which ``ir.load`` reads back into memory
    before the folder goes.
    """
    with tempfile.TemporaryDirectory(prefix="modelpress-ort-") as tmp:
        source = save(model, Path(tmp) / "in.onnx", external_data=external_data)
        target = Path(tmp) / "out.onnx"
        options = session_options(optimize=level)
        options.optimized_model_filepath = str(target)
        if Path(f"{source}.data").exists():  # over the protobuf limit: so is the output
            options.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name", "out.onnx.data"
            )
            options.add_session_config_entry(
                "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
            )
        session(source, options=options)
        # ORT's output holds contrib ops the ONNX checker has no schema for.
        return load(target, check=False)


def _reloads(model: ir.Model) -> bool:
    """Whether ONNX Runtime loads ``model`` with its graph optimizations disabled."""
    try:
        session(model, optimize="disabled")
    except ModelLoadError:
        return False
    return True


class OrtFusions(GraphPass):
    """Persist ONNX Runtime's own graph optimizations (contrib-op fusions, NCHWc layout)."""

    name = "ort-fusions"
    level = 3
    standard = False
    recurse = False  # ORT optimizes the whole model, subgraphs and functions included
    #: the ORT optimization level persisted: "extended" (portable) or "all" (adds NCHWc layout)
    ort_level = "all"

    def __init__(self) -> None:
        super().__init__()
        self._last_signature: tuple | None = None

    def call(self, model: ir.Model) -> PassResult:
        self.model = model
        if self._last_signature == _signature(model):
            return PassResult(model, modified=False)
        try:
            optimized = ort_optimize(model, level=self.ort_level)
        except ModelLoadError as exc:
            # ORT's own optimizer can fail on a model that ORT runs unoptimized (seen on the
            # expanded affine_grid node tests): then there is nothing ORT-specific to persist.
            self.refuse(None, f"ONNX Runtime's optimizer failed: {exc}")
            self._last_signature = _signature(model)
            return PassResult(model, modified=False)
        before, after = _histogram(model), _histogram(optimized)
        changed = sum(((before - after) + (after - before)).values())
        if changed and not _reloads(optimized):
            # ORT's offline output is not always loadable by ORT itself (seen: a folded Range
            # bound written with shape [1] instead of a scalar); keep the model as it was then.
            self.refuse(None, "ONNX Runtime cannot load what its optimizer wrote")
            changed = 0
        if changed:
            self._adopt(model, optimized)
        self._last_signature = _signature(model)
        self.rewrites += changed
        return PassResult(model, modified=changed > 0)

    def _adopt(self, model: ir.Model, optimized: ir.Model) -> None:
        # An in-place pass must hand back the model object it was given: move the new graph in.
        model.graph = optimized.graph
        model.ir_version = max(model.ir_version, optimized.ir_version)
        model.functions.clear()
        model.functions.update(optimized.functions)
        portability = (
            "NCHWc layout tied to this CPU's instruction set"
            if self.ort_level == "all"
            else "portable across CPUs"
        )
        model.metadata_props[METADATA_KEY] = (
            f"onnxruntime {onnxruntime.__version__} CPU execution provider, level {self.ort_level} "
            f"({portability}); "
            "load with graph optimizations disabled"
        )
