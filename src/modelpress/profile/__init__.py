"""Per-node cost model: FLOPs and bytes moved per node at a given input shape; training totals;
analytic LLM costs; built-in workloads by name."""

from modelpress.profile.cost import ModelCost, NodeCost, profile_model
from modelpress.profile.llm import LLMConfig, config_from_dict, llm_workload, load_config
from modelpress.profile.training import TrainingMemory, training_flops, training_memory
from modelpress.profile.workload import Kernel, Workload, workload_from_onnx
from modelpress.profile.workloads import WORKLOADS, get_workload

__all__ = [
    "WORKLOADS",
    "Kernel",
    "LLMConfig",
    "ModelCost",
    "NodeCost",
    "TrainingMemory",
    "Workload",
    "config_from_dict",
    "get_workload",
    "llm_workload",
    "load_config",
    "profile_model",
    "training_flops",
    "training_memory",
    "workload_from_onnx",
]
