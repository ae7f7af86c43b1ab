"""Graph rewrites: one pass a file, a registry, pipelines by level.

Importing a pass module registers it; the import order below is the order passes run in each round.
"""

# ruff: noqa: F401, I001  (imports register the passes; their order matters)
# --- clean-up ---
from modelpress.passes import cleanup
# --- no-op elimination, constant folding, replacements ---
from modelpress.passes import constant_folding, noop
# --- fusions ---
from modelpress.passes import fuse_conv_bn, fuse_conv_scale, fuse_matmul_add, fuse_pad, fuse_layernorm, fuse_gelu
# --- reordering and cancellation ---
from modelpress.passes import reorder_crop, cancel_transpose, merge_reshape, cancel_squeeze, merge_slice, flatten_concat
from modelpress.passes import batchnorm_to_scale, reducemean_to_pool, merge_scale_chains, guard_softmax
# --- level 3: ONNX Runtime-specific ---
from modelpress.passes import ort_fusions
from modelpress.passes.optimize import OptimizeResult, PassStats, optimize
from modelpress.passes.registry import REGISTRY, get, register

__all__ = ["REGISTRY", "OptimizeResult", "PassStats", "get", "optimize", "register"]
