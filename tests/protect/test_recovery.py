"""Runtime-mode obfuscation against the standard tools, run as an attacker who holds the key:
ONNX Runtime's optimizer at every level (its optimized graph saved), the ONNX inliner, onnxsim
and onnxslim (``recovery.py``). After each one:

- no original weight correlates with any tensor of the result (in any axis order of the weight;
  Spearman's rank correlation) above the chance level for its size (``recovery.chance_threshold``:
  the normal approximation, Bonferroni over every pair the check compares, every tool's result
  included, alpha = 1e-3);
- fewer than 10% of the original op types are there at their original count;
- and the model's outputs are the original's, bit for bit where the runtime allows.

And no original name (values, nodes, initializers, graphs, functions) is anywhere in the package's
bytes or in the model it opens to. The model's own metadata is given back on purpose (it is part of
its interface, like its input and output names) and is not searched for.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from protect_models import sample_inputs
from recovery import original_weights, same_count_share, tool_results, worst_correlation

from modelpress.ir import load, model_bytes
from modelpress.protect import open_package, protect
from modelpress.protect.metrics import names_in
from modelpress.runtime.ort import session


def _names(model) -> list[str]:
    found: set[str] = set()
    for graph in model.graphs():
        found.add(graph.name or "")
        for v in [*graph.inputs, *graph.outputs, *graph.initializers.values()]:
            found.add(v.name or "")
        for node in graph:
            found.add(node.name or "")
            found.update(v.name or "" for v in node.outputs)
    for f in model.functions.values():
        found.update((f.name, f.domain))
    interface = {v.name for v in (*model.graph.inputs, *model.graph.outputs)}
    return sorted(n for n in found - interface if len(n) >= 5)


@pytest.fixture(
    scope="module", params=["resnet-digits", pytest.param("bert-tiny", marks=pytest.mark.slow)]
)
def attacked(request, zoo_paths, tmp_path_factory):
    name = request.param
    key = bytes(range(32))
    out = tmp_path_factory.mktemp("recovery") / f"{name}.mpk"
    protect(zoo_paths[name], key=key, output=out, obfuscate=True, ratio=0.1, seed=7)
    opened = open_package(out, key)
    return name, zoo_paths[name], out, opened, tool_results(opened)


def test_no_weight_comes_back(attacked):
    name, source, _, _, results = attacked
    weights = original_weights(onnx.load(str(source)))
    assert len(weights) >= 8
    for tool, result in results.items():
        worst = worst_correlation(weights, result, family=len(results))
        assert worst["r"] < worst["threshold"], (name, tool, worst)


def test_op_types_lose_their_counts(attacked):
    name, source, _, _, results = attacked
    original = onnx.load(str(source))
    for tool, result in results.items():
        assert same_count_share(original, result) < 0.10, (name, tool)


def test_the_tools_results_still_compute_the_model(attacked):
    name, source, _, opened, results = attacked
    feeds = sample_inputs(name)
    want = session(load(source)).run(None, feeds)[0]
    runtime = {v.name: v.const_value.numpy() for v in opened.graph.initializers.values()}
    for tool, result in results.items():
        if tool.startswith("ort"):
            continue  # written for this machine's kernels (NCHWc, ...): run where it was made
        inputs = {i.name for i in result.graph.input}
        given = {k: v for k, v in runtime.items() if k in inputs}
        got = session(result.SerializeToString()).run(None, {**feeds, **given})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=tool)


def test_no_original_name_in_the_package_or_what_it_opens_to(attacked):
    _, source, package, opened, _ = attacked
    names = _names(load(source))
    assert len(names) > 20
    assert names_in(package.read_bytes(), names) == []
    assert names_in(model_bytes(opened), names) == []


def test_the_check_finds_a_weight_that_comes_back(zoo_paths):
    """The correlation check itself: each original weight, negated, scaled and shifted among
    random tensors of the same sizes, is found; the random tensors alone stay at chance."""
    weights = original_weights(onnx.load(str(zoo_paths["resnet-digits"])))
    rng = np.random.default_rng(0)
    noise = [rng.standard_t(3, w.size).reshape(w.shape) for w in weights for _ in range(3)]

    def model(tensors):
        inits = [
            numpy_helper.from_array(t.astype(np.float32), f"t{i}") for i, t in enumerate(tensors)
        ]
        return helper.make_model(helper.make_graph([], "g", [], [], inits))

    chance = worst_correlation(weights, model(noise), family=6)
    assert chance["r"] < chance["threshold"], chance
    sized = sorted((w for w in weights if w.size >= 64), key=lambda w: w.size)
    for w in (sized[0], sized[len(sized) // 2], sized[-1]):
        planted = model([*noise, 1.0 - 3.0 * w.transpose()])
        worst = worst_correlation(weights, planted, family=6)
        assert worst["n"] == w.size and worst["r"] > 0.999 > worst["threshold"], worst
