"""Per-node cost model: FLOPs and bytes moved per node at a given input shape."""

from modelpress.profile.cost import NodeCost, ModelCost, profile_model

__all__ = ["ModelCost", "NodeCost", "profile_model"]
