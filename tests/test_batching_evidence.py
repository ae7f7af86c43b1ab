"""One batching decision for serve and run, by evidence (a batch of 2 against two single runs),
with an override. Before: serve batched only models whose every input and output named one batch
dimension (TorchScript and tf2onnx exports ran one request at a time), run read the graph alone
(a subgraph was enough to refuse), and two anonymous ``?`` dimensions were taken as one."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from modelpress.cli.main import main
from modelpress.ir import from_proto, save
from modelpress.runtime.batch import batch_rule
from modelpress.runtime.ort import session
from modelpress.serve.repository import Repository
from modelpress.verify.batching import decide_batching


def _model(nodes, x_dims, y_dims, inits=()) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, y_dims)
    graph = helper.make_graph(nodes, "g", [x], [y], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def with_subgraph() -> onnx.ModelProto:
    """Per-sample, behind an If (as TorchScript exports write control flow), and the batch named
    differently in the input and the output (as tf2onnx writes ``unk__N``)."""
    then_out = helper.make_tensor_value_info("t", TensorProto.FLOAT, None)
    else_out = helper.make_tensor_value_info("e", TensorProto.FLOAT, None)
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [then_out])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [else_out])
    nodes = [
        helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", 9, [], [1])),
        helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
    ]
    return _model(nodes, ["unk__1", 4], ["unk__2", 4])


def mixing() -> onnx.ModelProto:
    """x minus its mean over the batch: every row depends on the others."""
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[0], keepdims=1),
        helper.make_node("Sub", ["x", "m"], ["y"]),
    ]
    return helper.make_model(
        helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        ),
        opset_imports=[helper.make_opsetid("", 13)],
    )


def _runner(model):
    sess = session(model)
    names = [o.name for o in sess.get_outputs()]
    return lambda feeds: dict(zip(names, sess.run(names, feeds)))


def test_evidence_batches_what_the_graph_rule_cannot_prove():
    model = from_proto(with_subgraph())
    assert not batch_rule(model).per_sample  # the graph rule: "has a subgraph"
    rule = decide_batching(model, _runner(model))
    assert rule.per_sample and rule.reason == ""
    # and refuses what mixes samples, with the reason
    mixed = from_proto(mixing())
    rule = decide_batching(mixed, _runner(mixed))
    assert not rule.per_sample and "differs from two single runs" in rule.reason
    # the override wins either way
    assert decide_batching(mixed, _runner(mixed), override="per-sample").per_sample
    assert not decide_batching(model, _runner(model), override="whole").per_sample
    with pytest.raises(Exception, match="choose one of"):
        decide_batching(model, override="sometimes")


def test_serve_batches_by_evidence_and_says_why_not(tmp_path):
    repo = Repository.open(
        [("sub", from_proto(with_subgraph())), ("mix", from_proto(mixing()))], backend="ort"
    )
    sub, mix = repo.models["sub"], repo.models["mix"]
    assert sub.batchable  # before: unk__1 and unk__2 are not one name, run alone
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    feeds, rows, key = sub.check({"x": x})
    assert rows == 3 and key == ((4,),)
    np.testing.assert_array_equal(sub.run(feeds)["y"], np.maximum(x, 0))
    assert not mix.batchable and "differs from two single runs" in mix.batch_reason
    whole = Repository.open([("sub", from_proto(with_subgraph()))], batching="whole")
    assert not whole.models["sub"].batchable


def test_two_anonymous_dimensions_are_two(tmp_path):
    # PaddleOCR's direction classifier: x[?, 3, 48, ?] (paddle2onnx writes "?" for unknown)
    proto = _model([helper.make_node("Relu", ["x"], ["y"])], ["?", 3, 48, "?"], ["?", 3, 48, "?"])
    repo = Repository.open([("cls", from_proto(proto))])
    served = repo.models["cls"]
    x = np.random.default_rng(0).standard_normal((1, 3, 48, 192)).astype(np.float32)
    # before: 400 "input 'x' has size 192 on axis 3 ('?'), but input 'x' has 1 there"
    feeds, rows, _ = served.check({"x": x})
    np.testing.assert_array_equal(served.run(feeds)["y"], np.maximum(x, 0))
    assert served.inputs[0].wire_shape() == [-1, 3, 48, -1]


def test_run_batches_by_the_same_decision(tmp_path, capsys):
    path = save(from_proto(with_subgraph()), tmp_path / "m.onnx")
    x = np.random.default_rng(1).standard_normal((6, 4)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    argv = ["run", str(path), str(tmp_path / "x.npz"), "-o", str(tmp_path / "p.npz")]
    # before: "--batch-size ignored: ran the batch whole because If ... has a subgraph"
    assert main([*argv, "--batch-size", "2", "--json", str(tmp_path / "r.json")]) == 0
    import json

    result = json.loads((tmp_path / "r.json").read_text())["result"]
    assert result["batch_size"] == 2 and result["batches"] == 3 and result["rule"]["per_sample"]
    np.testing.assert_array_equal(np.load(tmp_path / "p.npz")["y"], np.maximum(x, 0))
    assert main([*argv, "--batch-size", "2", "--batching", "whole"]) == 0
    assert "--batch-size ignored" in capsys.readouterr().err


def test_a_model_that_runs_alone_still_counts_rows():
    repo = Repository.open([("mix", from_proto(mixing()))])
    mix = repo.models["mix"]
    x = np.ones((3, 4), np.float32)
    # before: 1 (a request), where Triton counts the 3 rows the model ran
    feeds, rows, key = mix.check({"x": x})
    assert (rows, key) == (3, None)
