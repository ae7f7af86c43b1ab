"""Dependency groups on small graphs: what must go together, and pruning that keeps the outputs.

Each model is analyzed on a real batch; the groups are checked against the structure written in
the builder, the pruned graph must pass the ONNX checker and run, and with the chosen components'
every entry set to zero first (so they contribute nothing), removing them must leave the outputs
as they were (up to float summation order, 1e-6).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from train_models import (
    concat_cnn,
    depthwise_cnn,
    image_batch,
    residual_cnn,
    token_batch,
    transformer_block,
)

from modelpress.compress.prune import importance, surgery
from modelpress.compress.prune.analyzer import Refuse, analyze
from modelpress.compress.prune.depgraph import Track, param, probe_shapes
from modelpress.compress.prune.rules import regroup
from modelpress.compress.prune.structured import choose
from modelpress.ir import to_proto
from modelpress.ir.graph import add_initializer, copy_model
from modelpress.verify import run_model


def _groups(model, feeds, keep=()):
    dg = analyze(copy_model(model), probe_shapes(model, feeds), keep=keep)
    return dg, {tuple(g.sources): g for g in dg.groups}


def _zero(dg, components: set) -> None:
    """Set every entry the components own to zero, in ``dg.model``."""
    by_param: dict = {}
    for s in dg.slices:
        units = [
            u for u in range(dg.tracks[s.value].units) if dg.uf.find((s.value, u)) in components
        ]
        if not units or s.role == "stat":
            continue
        by_param.setdefault((id(s.node), s.input), (s.node, s.input, []))[2].append(
            (s.axis, s.indices(units))
        )
    for node, index, cuts in by_param.values():
        array = param(node.inputs[index]).copy()
        for axis, idx in cuts:
            sl = [slice(None)] * array.ndim
            sl[axis] = idx
            array[tuple(sl)] = 0
        node.replace_input_with(index, add_initializer(dg.model.graph, array, "zeroed"))


def _prune_zeroed(model, feeds, ratio, head_ratio=None):
    """Zero the components ``choose`` would remove at random scores, check they score 0, remove them."""
    dg = analyze(copy_model(model), probe_shapes(model, feeds))
    rng = np.random.default_rng(0)
    random_scores = {c: float(rng.random()) + 1.0 for g in dg.groups for c in g.components}
    chosen = choose(dg, random_scores, ratio=ratio, head_ratio=head_ratio)
    assert chosen
    _zero(dg, chosen)
    zeroed = copy_model(dg.model)
    # a re-analysis of the zeroed model picks exactly those components as the least important,
    # by their weights and by what they add to the layers that read them
    dg2 = analyze(copy_model(zeroed), probe_shapes(zeroed, feeds))
    activation = importance.scores(
        dg2, "activation", activations=importance.input_rms(dg2, [feeds])
    )
    assert choose(dg2, activation, ratio=ratio, head_ratio=head_ratio) == choose(
        dg2, importance.scores(dg2, "l1"), ratio=ratio, head_ratio=head_ratio
    )
    scores = importance.scores(dg2, "l1")
    picked = choose(dg2, scores, ratio=ratio, head_ratio=head_ratio)
    assert all(scores[c] == 0.0 and activation[c] == 0.0 for c in picked)
    surgery.remove(dg2, picked)
    onnx.checker.check_model(to_proto(dg2.model), full_check=True)
    return zeroed, dg2.model


@pytest.mark.parametrize(
    "build, feeds",
    [
        (residual_cnn, lambda r: image_batch(r)),
        (concat_cnn, lambda r: image_batch(r)),
        (depthwise_cnn, lambda r: image_batch(r)),
        (transformer_block, lambda r: token_batch(r)),
    ],
)
def test_zero_components_removed_keep_outputs(build, feeds, rng):
    model = build()
    x = feeds(rng)
    zeroed, pruned = _prune_zeroed(model, x, ratio=0.5)
    before = run_model(zeroed, x)
    after = run_model(pruned, x)
    for name in before:
        assert after[name].shape == before[name].shape
        np.testing.assert_allclose(after[name], before[name], rtol=0, atol=1e-6)
    n_before = sum(v.const_value.size for v in zeroed.graph.initializers.values())
    n_after = sum(v.const_value.size for v in pruned.graph.initializers.values())
    assert n_after < n_before
    # other batch sizes too: nothing was fixed to the probe's shape
    y = feeds(np.random.default_rng(5))
    y = {k: np.concatenate([v, v, v]) for k, v in y.items()}
    np.testing.assert_allclose(
        run_model(pruned, y)["y"], run_model(zeroed, y)["y"], rtol=0, atol=1e-6
    )


def test_residual_groups(rng):
    _, groups = _groups(residual_cnn(), image_batch(rng))
    # the stem and the block's second Conv write the same channels (the residual Add joins them)
    joined = [g for g in groups.values() if len(g.sources) == 2]
    assert len(joined) == 1 and joined[0].size == 8 and joined[0].kind == "channels"
    inner = [g for g in groups.values() if g.size == 6]
    assert len(inner) == 1 and len(inner[0].components) == 6
    head = [g for g in groups.values() if g.sources == ["head"]]
    assert head and head[0].components == []  # the graph output is blocked


def test_concat_split_groups(rng):
    model = concat_cnn()
    dg, groups = _groups(model, image_batch(rng))
    first = next(n.name for n in model.graph if n.op_type == "Conv")
    stem = next(g for g in dg.groups if first in g.sources)
    # the stem's 8 channels (through Split into 3 + 5), the 5 of the Conv on the second part and
    # the 4 of the third branch all meet in the Concat: one group of 17 coupled channels
    assert stem.size == 17 and len(stem.components) == 17 and len(stem.sources) == 3
    scores = importance.scores(dg, "l2")
    surgery.remove(dg, choose(dg, scores, ratio=0.5))
    by_name = {n.name: n for n in dg.model.graph}
    split = next(n for n in dg.model.graph if n.op_type == "Split")
    sizes = param(split.inputs[1])
    assert sizes.sum() == param(by_name[first].inputs[1]).shape[0]  # the split sizes follow
    assert run_model(dg.model, image_batch(rng))["y"].shape == (4, 4)


def test_depthwise_and_grouped(rng):
    model = depthwise_cnn()
    convs = [n.name for n in model.graph if n.op_type == "Conv"]
    dg, _ = _groups(model, image_batch(rng))
    first = next(g for g in dg.groups if convs[0] in g.sources)
    # the depthwise Conv's channels are its input's channels: no source of their own
    assert first.size == 8 and not any(convs[1] in g.sources for g in dg.groups)
    grouped = next(g for g in dg.groups if convs[3] in g.sources)
    # 2 groups of 4 outputs: local output k goes from both groups at once
    assert grouped.size == 4
    scores = importance.scores(dg, "l1")
    surgery.remove(dg, choose(dg, scores, ratio=0.5))
    by_name = {n.name: n for n in dg.model.graph}
    dw = by_name[convs[1]]
    assert dw.attributes["group"].value == param(dw.inputs[1]).shape[0] == 4
    pw, gconv = param(by_name[convs[2]].inputs[1]), param(by_name[convs[3]].inputs[1])
    assert gconv.shape[:2] == (4, pw.shape[0] // 2)  # 2 groups still, each reading half
    assert by_name[convs[3]].attributes["group"].value == 2
    head = param(by_name["head"].inputs[1])
    assert head.shape == (4, gconv.shape[0] * 16)  # the flattened map into the Gemm follows
    assert run_model(dg.model, image_batch(rng))["y"].shape == (4, 4)


def test_attention_heads_and_ffn(rng):
    dg, _ = _groups(transformer_block(), token_batch(rng))
    kinds = sorted((g.kind, g.size, len(g.components)) for g in dg.groups)
    # 4 heads (Q, K, V and the context, through the head-split Reshapes), 32 FFN neurons; the
    # hidden size feeds the graph output and LayerNorm: blocked
    assert ("heads", 4, 4) in kinds and ("neurons", 32, 32) in kinds
    scores = importance.scores(dg, "l1")
    surgery.remove(dg, choose(dg, scores, ratio=0.5, head_ratio=0.25))
    shapes = [param(n.inputs[1]) for n in dg.model.graph if n.op_type == "Reshape"]
    assert any(list(s) == [0, 0, 3, 4] for s in shapes)  # 3 heads of 4 left: the target follows
    assert any(list(s) == [0, 0, 12] for s in shapes)
    assert run_model(dg.model, token_batch(rng, n=3, s=7))["y"].shape == (3, 7, 16)


def test_exported_shape_targets_follow_the_heads(rng):
    model = transformer_block(exported=True)
    x = token_batch(rng)
    dg, _ = _groups(model, x)
    assert ("heads", 4, 4) in [(g.kind, g.size, len(g.components)) for g in dg.groups]
    scores = importance.scores(dg, "l1")
    surgery.remove(dg, choose(dg, scores, ratio=0.0, head_ratio=0.5))
    # the head count and the merged width live in Concat pieces: each Reshape got its own Concat
    pieces = sorted(
        int(param(v)[0])
        for n in dg.model.graph
        if n.op_type == "Concat"
        for v in n.inputs
        if param(v) is not None
    )
    assert 2 in pieces and 8 in pieces
    y = token_batch(rng, n=3, s=6)
    assert run_model(dg.model, y)["y"].shape == (3, 6, 16)
    zeroed, pruned = _prune_zeroed(model, x, ratio=0.0, head_ratio=0.5)
    np.testing.assert_allclose(
        run_model(pruned, y)["y"], run_model(zeroed, y)["y"], rtol=0, atol=1e-6
    )


def test_kept_layer_stays_whole(rng):
    model = residual_cnn()
    keep = [n.name for n in model.graph if n.op_type == "Conv"][1]  # the block's first Conv
    dg = analyze(copy_model(model), probe_shapes(model, image_batch(rng)), keep=[keep])
    scores = importance.scores(dg, "l1")
    surgery.remove(dg, choose(dg, scores, ratio=0.5))
    node = next(n for n in dg.model.graph if n.name == keep)
    assert param(node.inputs[1]).shape == (6, 8, 3, 3)


def test_regroup():
    # flatten: the 8 channels of (N, 8, 4, 4) become 8 blocks of 16 features
    assert regroup((2, 8, 4, 4), (2, 128), Track(1, 8, 8)) == (1, 8)
    # head split: 384 features into 12 heads of 32 merge into 12 units on the heads axis
    assert regroup((2, 5, 384), (2, 5, 12, 32), Track(2, 384, 384)) == (2, 12)
    assert regroup((2, 5, 12, 32), (2, 5, 384), Track(2, 12, 12)) == (2, 12)
    with pytest.raises(Refuse):  # channels mixed with the batch: not followed
        regroup((2, 8, 4), (16, 4), Track(1, 8, 8))
