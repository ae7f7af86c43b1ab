"""``inspect_model()``: what a model is (interface, opsets, ops, parameters) and what it costs
(FLOPs and bytes per node) at concrete input shapes.

Costs need concrete shapes: inputs the caller sizes whole (``shapes``) keep those; a dynamic
dimension takes its size from ``dims`` by name, or else ``default_dim``; the names left to the
default are listed in the result, so that a reader knows which numbers assumed a size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_ir as ir

from modelpress.ir import GraphStats, graph_stats
from modelpress.ir.shapes import static_dim
from modelpress.profile.cost import ModelCost, profile_model
from modelpress.verify.inputs import dim_name, resolve_shape


@dataclass(frozen=True)
class Inspection:
    stats: GraphStats
    cost: ModelCost
    shapes: dict[str, tuple[int, ...]]  # the input shapes the costs were counted at
    defaulted: list[str] = field(default_factory=list)  # dynamic dimensions given default_dim

    def to_dict(self) -> dict:
        return {
            **self.stats.to_dict(),
            "shapes": {k: list(v) for k, v in self.shapes.items()},
            "defaulted_dims": self.defaulted,
            "flops": self.cost.flops,
            "bytes": self.cost.bytes,
            "unknown_shapes": self.cost.unknown_shapes,
            "nodes": [n.__dict__ for n in self.cost.nodes],
        }


def inspect_model(
    model: ir.Model,
    *,
    shapes: dict[str, tuple[int, ...]] | None = None,
    dims: dict[str, int] | None = None,
    default_dim: int = 1,
) -> Inspection:
    """Statistics and per-node costs of ``model`` at the input sizes given (see the module)."""
    shapes = dict(shapes or {})
    dims = dims or {}
    defaulted: set[str] = set()
    for value in model.graph.inputs:
        if value.name in shapes or value.name in model.graph.initializers or value.shape is None:
            continue
        for d in value.shape:
            if static_dim(d) is None and dim_name(d) not in dims:
                defaulted.add(dim_name(d) or "?")
        shapes[value.name] = resolve_shape(value, dims, default_dim)
    return Inspection(
        stats=graph_stats(model),
        cost=profile_model(model, shapes),
        shapes=shapes,
        defaulted=sorted(defaulted),
    )
