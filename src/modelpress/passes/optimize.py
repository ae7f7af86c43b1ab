"""``optimize()``: run the passes of a level to a fixed point and say what changed.

Each round runs every selected pass once, in pipeline order (``pipeline.PIPELINE``); rounds repeat until a round changes
nothing (or ``max_rounds``). Level 3 output is marked in the model's metadata as tied to a runtime.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import onnx_ir as ir
import onnx_ir.passes.common as common

from modelpress.errors import OptionError
from modelpress.ir.opset import upgrade_opset
from modelpress.ir.stats import iter_graphs
from modelpress.passes import registry
from modelpress.passes.base import GraphPass

RUNTIME_METADATA_KEY = "modelpress.target_runtime"


@dataclass
class PassStats:
    name: str
    rewrites: int = 0
    seconds: float = 0.0


@dataclass
class OptimizeResult:
    model: ir.Model
    level: int
    passes: list[PassStats] = field(default_factory=list)
    rounds: int = 0
    seconds: float = 0.0

    @property
    def rewrites(self) -> int:
        return sum(p.rewrites for p in self.passes)

    def to_dict(self) -> dict:
        return {
            "level": self.level,
            "rounds": self.rounds,
            "seconds": round(self.seconds, 4),
            "rewrites": self.rewrites,
            "passes": [p.__dict__ for p in self.passes],
        }


def _intermediate_values(model: ir.Model):
    for graph in iter_graphs(model.graph):
        outputs = {id(v) for v in graph.outputs}
        for node in graph:
            for value in node.outputs:
                if id(value) not in outputs:
                    yield value


def _annotated_values(model: ir.Model) -> set[str]:
    return {v.name for v in _intermediate_values(model) if v.type is not None and v.name}


def _drop_new_annotations(model: ir.Model, annotated: set[str]) -> None:
    """Forget the shapes and types the passes inferred for intermediate values.

    Passes infer them as working state; written out (as value_info) they change what a runtime
    does with the file: ONNX Runtime, seeing them, fuses Add + LayerNormalization into
    SkipLayerNormalization, whose CPU kernel runs MiniLM slower than the original's unfused pair.
    The model leaves with the annotations it came with, and no new ones.
    """
    for value in _intermediate_values(model):
        if value.name not in annotated:
            value.type = None
            value.shape = None


def select_passes(
    level: int, passes: list[str] | None, skip: list[str] | None
) -> list[type[GraphPass]]:
    if passes:
        chosen = [registry.get(n) for n in passes]
    else:
        chosen = registry.for_level(level)
    for name in skip or []:
        registry.get(name)  # unknown names are an error, not silently ignored
    skip_set = set(skip or [])
    return [c for c in chosen if c.name not in skip_set]


def optimize(
    model: ir.Model,
    *,
    level: int = 2,
    passes: list[str] | None = None,
    skip: list[str] | None = None,
    opset: int | None = None,
    max_rounds: int = 10,
) -> OptimizeResult:
    """Optimize ``model`` in place and return it with per-pass rewrite counts and times.

    ``passes`` runs exactly those passes (any level); ``skip`` removes passes from the selection.
    ``opset`` first upgrades the model to that opset, which lets fusions use newer standard ops
    (LayerNormalization from 17, Gelu from 20); without it the model's opset is kept.
    """
    if max_rounds < 1:
        raise OptionError("max_rounds must be at least 1")
    if opset is not None:
        model = upgrade_opset(model, opset)
    classes = select_passes(level, passes, skip)
    annotated = _annotated_values(model)
    instances = [cls() for cls in classes]
    stats = [PassStats(p.name) for p in instances]
    start = time.perf_counter()
    rounds = 0
    for _ in range(max_rounds):
        rounds += 1
        changed = False
        for p, s in zip(instances, stats):
            t0 = time.perf_counter()
            before = p.rewrites
            result = p(model)
            model = result.model
            s.seconds += time.perf_counter() - t0
            s.rewrites += p.rewrites - before
            changed |= result.modified
        if not changed:
            break
    model.graph.sort()
    _drop_new_annotations(model, annotated)
    # Rewrites inside subgraphs may mint a name an outer graph already uses; ONNX Runtime refuses
    # such models (the checker does not), so names are made unique once at the end.
    common.NameFixPass()(model)
    if any(not p.standard and s.rewrites for p, s in zip(instances, stats)):
        model.metadata_props[RUNTIME_METADATA_KEY] = "onnxruntime"
    return OptimizeResult(
        model=model,
        level=level,
        passes=stats,
        rounds=rounds,
        seconds=time.perf_counter() - start,
    )
