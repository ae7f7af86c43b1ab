"""The order passes run in, as data: each round of ``optimize()`` runs the selected passes in this
order, and rounds repeat until nothing changes.

The order matters for speed, not for the result's correctness: every pass is legal on its own and
the rounds run to a fixed point. It is chosen so that most models settle in two or three rounds:

1. clean-up first: dead nodes, identities, duplicates, so later passes see each value once;
2. constant folding and no-op elimination: fusions need constant weights and shapes;
3. fusions into the linear ops (BatchNorm and scales into Conv/Gemm, bias Add into Gemm, Pad into
   Conv/pools), then the activation and normalization patterns;
4. reordering and cancellation of data movement (crops ahead of element-wise ops, Transpose,
   Reshape, Squeeze, Slice, Concat chains);
5. replacements for what no fusion took: a leftover BatchNormalization becomes a scale (after the
   fusions, so they get the first chance), mean pooling, scale chains merged, Softmax guarded;
6. level 3: ONNX Runtime's own optimizer, last, on the graph the standard passes left.
"""

from __future__ import annotations

from modelpress.passes.base import GraphPass
from modelpress.passes.batchnorm_to_scale import BatchNormToScale
from modelpress.passes.cancel_squeeze import CancelSqueeze
from modelpress.passes.cancel_transpose import CancelTranspose
from modelpress.passes.constant_folding import FoldConstants
from modelpress.passes.cse import CommonSubexpressions
from modelpress.passes.dead_code import RemoveDeadCode
from modelpress.passes.dedup_initializers import DeduplicateInitializers
from modelpress.passes.flatten_concat import FlattenConcat
from modelpress.passes.fuse_conv_bn import FuseConvBatchNorm
from modelpress.passes.fuse_conv_scale import FuseConvScale
from modelpress.passes.fuse_gelu import FuseGelu
from modelpress.passes.fuse_layernorm import FuseLayerNorm
from modelpress.passes.fuse_matmul_add import FuseMatMulAdd
from modelpress.passes.fuse_pad import FusePad
from modelpress.passes.guard_softmax import GuardSoftmax
from modelpress.passes.identity import EliminateIdentity
from modelpress.passes.merge_reshape import MergeReshape
from modelpress.passes.merge_scale_chains import MergeScaleChains
from modelpress.passes.merge_slice import MergeSlice
from modelpress.passes.noop import EliminateNoOps
from modelpress.passes.ort_fusions import OrtFusions
from modelpress.passes.reducemean_to_pool import ReduceMeanToPool
from modelpress.passes.reorder_crop import ReorderCrop

PIPELINE: tuple[type[GraphPass], ...] = (
    # 1. clean-up
    RemoveDeadCode,
    EliminateIdentity,
    CommonSubexpressions,
    DeduplicateInitializers,
    # 2. constants and no-ops
    FoldConstants,
    EliminateNoOps,
    # 3. fusions
    FuseConvBatchNorm,
    FuseConvScale,
    FuseMatMulAdd,
    FusePad,
    FuseLayerNorm,
    FuseGelu,
    # 4. reordering and cancellation
    ReorderCrop,
    CancelTranspose,
    MergeReshape,
    CancelSqueeze,
    MergeSlice,
    FlattenConcat,
    # 5. replacements for what the fusions left
    BatchNormToScale,
    ReduceMeanToPool,
    MergeScaleChains,
    GuardSoftmax,
    # 6. level 3: ONNX Runtime-specific
    OrtFusions,
)
