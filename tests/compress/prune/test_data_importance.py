"""Data-aware importance of neurons and heads (calibration.py) and the least-squares refit of
their readers (refit.py), on a post-norm transformer block with planted units."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from train_models import transformer_block

from modelpress.compress.prune import calibration as calib
from modelpress.compress.prune import surgery
from modelpress.compress.prune.api import prune
from modelpress.compress.prune.depgraph import Group, param
from modelpress.compress.prune.refit import obs_scores, refit, removal_order
from modelpress.compress.prune.structured import analyze_model, choose
from modelpress.compress.train import TrainData
from modelpress.errors import OptionError
from modelpress.verify import run_model

HIDDEN, HEADS, FFN = 16, 4, 32


def _set(model: ir.Model, value: ir.Value, array: np.ndarray) -> None:
    model.graph.initializers[value.name].const_value = ir.tensor(
        array.astype(np.float32), name=value.name
    )


def _layers(model: ir.Model) -> dict[str, tuple[ir.Value, ir.Value | None]]:
    """(weight, bias) of the Q, K, V, output, FFN-in and FFN-out projections, in graph order."""
    names = ("q", "k", "v", "out", "ffn_in", "ffn_out")
    found = []
    for node in model.graph:
        if node.op_type == "MatMul" and param(node.inputs[1]) is not None:
            add = next(iter(node.outputs[0].uses())).node
            found.append((node.inputs[1], add.inputs[1] if add.op_type == "Add" else None))
    return dict(zip(names, found, strict=True))


def _planted(dead_neurons=(3, 17), dead_head: int | None = None) -> ir.Model:
    """A block whose ``dead_neurons`` never fire (GELU of -10: exactly 0 in float32) and whose
    ``dead_head`` has zero values; both have large output weights, so weight norms keep them."""
    model = transformer_block(hidden=HIDDEN, heads=HEADS, ffn=FFN)
    layers = _layers(model)
    (w1, b1), (w2, _) = layers["ffn_in"], layers["ffn_out"]
    a1, c1, a2 = param(w1).copy(), param(b1).copy(), param(w2).copy()
    for j in dead_neurons:
        a1[:, j], c1[j], a2[j] = 0.0, -10.0, 5.0
    _set(model, w1, a1), _set(model, b1, c1), _set(model, w2, a2)
    if dead_head is not None:
        (wv, bv), (wo, _) = layers["v"], layers["out"]
        d = HIDDEN // HEADS
        cols = slice(dead_head * d, (dead_head + 1) * d)
        av, cv, ao = param(wv).copy(), param(bv).copy(), param(wo).copy()
        av[:, cols], cv[cols], ao[cols] = 0.0, 0.0, 5.0
        _set(model, wv, av), _set(model, bv, cv), _set(model, wo, ao)
    return model


def _data(rng, n: int = 32, s: int = 5) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal((n, s, HIDDEN)).astype(np.float32)}


def _observed(model, feeds):
    dg = analyze_model(model, {"x": feeds["x"][:2]})
    found = calib.readers(dg)
    calib.observe(model, found, TrainData.load(feeds, model).batches(8))
    return dg, found


def test_planted_dead_units_rank_last(rng):
    model = _planted(dead_neurons=(3, 17), dead_head=2)
    dg, found = _observed(model, _data(rng))
    # one reader per group: the FFN's output projection (32 neurons), the attention output (4 heads)
    assert sorted((r.track.units, r.track.block) for r in found) == [
        (HEADS, HIDDEN // HEADS),
        (FFN, 1),
    ]
    scores = calib.scores(dg, found)
    by_kind = {
        g.kind: sorted(g.components, key=lambda c: scores[c])
        for g in dg.groups
        if g.kind in calib.KINDS and g.components
    }
    ffn = next(r for r in found if r.track.units == FFN)
    heads = next(r for r in found if r.track.units == HEADS)
    assert set(by_kind["neurons"][:2]) == {dg.component(ffn.value, 3), dg.component(ffn.value, 17)}
    assert by_kind["heads"][0] == dg.component(heads.value, 2)
    assert scores[by_kind["neurons"][0]] == 0 and scores[by_kind["heads"][0]] == 0
    assert min(scores[c] for c in by_kind["neurons"][2:]) > 0
    # weight norms rank the planted units first to keep: the opposite choice
    l1 = calib.imp.scores(dg, "l1")
    assert l1[dg.component(ffn.value, 3)] == max(l1[c] for c in by_kind["neurons"])


@pytest.mark.parametrize("method", ["activation", *calib.METHODS])
def test_pruning_dead_units_keeps_outputs(rng, method):
    model = _planted(dead_neurons=(3, 17), dead_head=2)
    data = _data(rng)
    result = prune(
        model, data=data, ratio=2 / FFN, head_ratio=1 / HEADS, importance=method, train=False
    )
    assert result.params_after < result.params_before
    x = _data(rng, n=4, s=7)
    np.testing.assert_allclose(
        run_model(result.model, x)["y"], run_model(model, x)["y"], rtol=0, atol=1e-5
    )
    # by weight norm the planted units stay and live ones go: the outputs change
    l1 = prune(model, data=data, ratio=2 / FFN, head_ratio=1 / HEADS, importance="l1", train=False)
    assert np.abs(run_model(l1.model, x)["y"] - run_model(model, x)["y"]).max() > 0.1


def _redundant() -> ir.Model:
    """A block whose FFN neuron 9 duplicates neuron 4 and whose neuron 20 is constant."""
    model = transformer_block(hidden=HIDDEN, heads=HEADS, ffn=FFN)
    (w1, b1) = _layers(model)["ffn_in"]
    a1, c1 = param(w1).copy(), param(b1).copy()
    a1[:, 9], c1[9] = a1[:, 4], c1[4]
    a1[:, 20], c1[20] = 0.0, 3.0
    _set(model, w1, a1), _set(model, b1, c1)
    return model


def test_refit_absorbs_duplicate_and_constant_neurons(rng):
    """A neuron that copies another and one that is constant carry nothing the rest cannot: the
    refit moves their output weights into the twin's and into the bias, and the outputs stay."""
    model = _redundant()
    feeds = _data(rng)
    dg, found = _observed(model, feeds)
    ffn = next(r for r in found if r.track.units == FFN)
    removed = {dg.component(ffn.value, 9), dg.component(ffn.value, 20)}
    assert refit(dg, found, removed, damping=0.0) == 1
    surgery.remove(dg, removed)
    x = _data(rng, n=4, s=7)
    np.testing.assert_allclose(
        run_model(dg.model, x)["y"], run_model(model, x)["y"], rtol=0, atol=2e-5
    )
    # removed without the refit, the same two neurons change the outputs
    plain, _ = _observed(model, feeds)
    surgery.remove(plain, {plain.component(ffn.value, 9), plain.component(ffn.value, 20)})
    assert np.abs(run_model(plain.model, x)["y"] - run_model(model, x)["y"]).max() > 0.05


def test_greedy_order_takes_the_redundant_neurons_first(rng):
    """What the rest can stand in for goes first: the constant neuron and one of the twins."""
    _, found = _observed(_redundant(), _data(rng))
    ffn = next(r for r in found if r.track.units == FFN)
    order, added = removal_order(ffn)
    assert sorted(order) == list(range(FFN))
    assert 20 in order[:2] and ({4, 9} & set(order[:2]))
    # what greedy removal adds: nothing for those two, then the error of losing live neurons
    assert max(added[:2]) < 1e-2 * min(added[2:-1]) and min(added[2:-1]) > 0 and added[-1] == np.inf


def test_obs_scores_are_the_error_added_so_far(rng):
    """``obs`` scores rise in removal order and are the summed output error of the removals so far;
    the refit would recover the twin and the constant neuron: they score (about) nothing."""
    model = _redundant()
    dg, found = _observed(model, _data(rng))
    ffn = next(r for r in found if r.track.units == FFN)
    scores = obs_scores(dg, found)
    order, added = removal_order(ffn)
    by_order = [scores[dg.component(ffn.value, u)] for u in order]
    np.testing.assert_allclose(by_order[:-1], np.cumsum(added[:-1]), rtol=1e-12)
    assert by_order[1] < 1e-2 * by_order[2] and by_order[-1] == np.inf


class _Groups:
    """The part of a DepGraph that ``choose`` reads."""

    def __init__(self, *groups: Group):
        self.groups = list(groups)


def _group(index: int, kind: str, units: int, blocked: int = 0) -> Group:
    return Group(
        index, kind, [f"v{index}"], [(index, u) for u in range(units)], blocked, [f"n{index}"]
    )


def test_global_ranking_takes_units_where_the_error_is_smallest():
    """Ranked together, the units of each kind go where they cost least, in the same total as a
    ratio per group; a group with nothing removable does not add to the budget; heads keep theirs."""
    a, b, blocked, h1, h2 = (
        _group(0, "neurons", 8),
        _group(1, "neurons", 8),
        _group(2, "neurons", 0, blocked=16),
        _group(3, "heads", 6),
        _group(4, "heads", 6),
    )
    dg = _Groups(a, b, blocked, h1, h2)
    scores = {c: 1e-3 * c[1] for c in a.components} | {c: 1.0 + c[1] for c in b.components}
    scores |= {c: 5.0 + c[1] for c in h1.components} | {c: 0.1 * c[1] for c in h2.components}
    uniform = choose(dg, scores, ratio=0.5, head_ratio=1 / 3)
    ranked = choose(
        dg,
        scores,
        ratio=0.5,
        head_ratio=1 / 3,
        global_ranking=True,
        comparable=("neurons", "heads"),
    )
    assert len(ranked) == len(uniform) == 8 + 4
    # at most 90% of a group: 7 of a's 8 neurons, then b's cheapest; all four heads from h2
    assert {c for c in ranked if c[0] == 0} == set(a.components[:7])
    assert {c for c in ranked if c[0] == 1} == {b.components[0]}
    assert {c for c in ranked if c[0] in (3, 4)} == set(h2.components[:4])
    # scores that do not compare across groups are ranked relative to their group's mean
    relative = choose(dg, scores, ratio=0.5, head_ratio=1 / 3, global_ranking=True)
    assert len(relative) == 12 and {c[0] for c in relative if c[0] in (0, 1)} == {0, 1}


def test_data_methods_need_data():
    with pytest.raises(OptionError, match="fisher importance needs training data"):
        prune(transformer_block(), ratio=0.5, importance="fisher")
    with pytest.raises(OptionError, match="refit needs training data"):
        prune(transformer_block(), ratio=0.5, refit=True)
