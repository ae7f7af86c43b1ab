"""The model zoo: every model builds, passes the checker, and computes what its source computes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from modelpress import zoo
from modelpress.errors import OptionError
from modelpress.verify import compare_arrays, run_model
from modelpress.verify.metrics import accuracy

torch = pytest.importorskip("torch")

TORCH_MODELS = ["resnet-digits", "mobilenet-digits", "bert-tiny"]
# Output agreement with the PyTorch source: fp32 relative error (max|a-b| / max|a|).
RTOL = 1e-4


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Zoo models built once for this module (the CNNs train for a few seconds each)."""
    folder = tmp_path_factory.mktemp("zoo")
    return {
        name: zoo.build(name, folder / f"{name}.onnx") for name in [*TORCH_MODELS, "control-flow"]
    }


def _torch_outputs(name: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    module, _ = zoo.build_torch(name)
    with torch.no_grad():
        out = module(*(torch.from_numpy(v) for v in feeds.values()))
    return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]


def _assert_matches(name: str, ort_out: dict[str, np.ndarray], ref: list[np.ndarray]) -> None:
    assert len(ort_out) == len(ref)
    for (out_name, got), want in zip(ort_out.items(), ref, strict=True):
        d = compare_arrays(out_name, want, got, rtol=RTOL, atol=0.0)
        assert d.passed, f"{name}/{out_name}: max rel {d.max_rel:.3g}, max abs {d.max_abs:.3g}"


def test_names_and_unknown_name():
    assert set(zoo.NAMES) == {
        "resnet-digits",
        "mobilenet-digits",
        "bert-tiny",
        "control-flow",
        "minilm",
    }
    with pytest.raises(OptionError, match="unknown zoo model 'resnet'"):
        zoo.build("resnet", "x.onnx")
    with pytest.raises(OptionError, match="no PyTorch source"):
        zoo.build_torch("control-flow")


def test_digits_data_split_and_normalisation():
    d = zoo.digits_data()
    assert d.x_train.shape[1:] == (1, 32, 32) and d.x_train.dtype == np.float32
    assert d.x_test.shape[1:] == (1, 32, 32) and d.y_test.dtype == np.int64
    assert len(d.x_train) + len(d.x_test) == 1797 and len(d.x_test) == 450
    assert abs(float(d.x_train.mean())) < 1e-5 and abs(float(d.x_train.std()) - 1.0) < 1e-4
    assert set(np.unique(d.y_train)) == set(range(10)) == set(np.unique(d.y_test))
    # The split is fixed, and callers get their own copies.
    d.x_train[:] = 0
    again = zoo.digits_data()
    assert again.x_train.std() > 0.5
    np.testing.assert_array_equal(again.y_test, d.y_test)


@pytest.mark.parametrize("name", [*TORCH_MODELS, "control-flow"])
def test_builds_a_valid_model(built, name):
    proto = onnx.load(str(built[name]))
    onnx.checker.check_model(proto, full_check=True)
    assert proto.opset_import[0].version == zoo.get(name).opset
    # The batch dimension (and the sequence, for text models) stays dynamic.
    for inp in proto.graph.input:
        assert inp.type.tensor_type.shape.dim[0].dim_param, f"{name}: {inp.name} has a fixed batch"


@pytest.mark.parametrize("name", TORCH_MODELS)
@pytest.mark.parametrize("batch,seq", [(1, 8), (5, 24)])
def test_matches_torch_source(built, name, batch, seq):
    feeds = zoo.sample_inputs(name, batch=batch, seq=seq)
    _assert_matches(name, run_model(built[name], feeds), _torch_outputs(name, feeds))


@pytest.mark.parametrize("name", ["resnet-digits", "mobilenet-digits"])
def test_cnn_accuracy_on_held_out_split(built, name):
    d = zoo.digits_data()
    logits = run_model(built[name], {"image": d.x_test})["logits"]
    assert accuracy(logits, d.y_test) > 0.9


def test_graph_features_an_optimizer_should_meet(built):
    def ops(name):
        return [n for n in onnx.load(str(built[name])).graph.node]

    resnet = ops("resnet-digits")
    assert (
        sum(n.op_type == "BatchNormalization" for n in resnet)
        == sum(n.op_type == "Conv" for n in resnet)
        == 9
    )
    mobile = ops("mobilenet-digits")
    assert sum(n.op_type == "Pad" for n in mobile) == 5
    assert sum(n.op_type == "Clip" for n in mobile) == 9  # hard-swish as Add/Clip/Mul/Div
    groups = [a.i for n in mobile if n.op_type == "Conv" for a in n.attribute if a.name == "group"]
    assert sum(g > 1 for g in groups) == 4  # the depthwise convolutions
    bert = {n.op_type for n in ops("bert-tiny")}
    assert {"Erf", "ReduceMean", "Pow", "Sqrt"} <= bert
    assert not bert & {"LayerNormalization", "Gelu"}


def _control_flow_formula(x: np.ndarray) -> list[np.ndarray]:
    from modelpress.zoo.control_flow import TRIPS, weights

    w = weights()
    h = x @ w["W"] + w["b"]
    y = np.maximum(h, 0) if h.sum() > 0 else 1 / (1 + np.exp(-h))
    acc, trace = x, []
    for i in range(TRIPS):
        acc = np.tanh(acc @ w["W2"] + w["b2"]) + i
        trace.append(acc.sum(axis=1))
    return [y, acc, np.stack(trace)]


def test_control_flow_matches_formula_on_both_branches(built):
    from modelpress.zoo.control_flow import weights

    proto = onnx.load(str(built["control-flow"]))
    assert {"If", "Loop"} <= {n.op_type for n in proto.graph.node}
    w = weights()
    branches = set()
    for batch in range(3, 9):
        x = zoo.sample_inputs("control-flow", batch=batch)["x"]
        branches.add(bool((x @ w["W"] + w["b"]).sum() > 0))
        _assert_matches(
            "control-flow",
            run_model(built["control-flow"], {"x": x}),
            _control_flow_formula(x.astype(np.float64)),
        )
    assert branches == {True, False}, "the inputs must take both If branches"


def test_build_reuses_a_matching_file_and_replaces_anything_else(built, tmp_path):
    path = built["bert-tiny"]
    mtime = path.stat().st_mtime_ns
    assert zoo.build("bert-tiny", path) == path
    assert path.stat().st_mtime_ns == mtime  # reused, not rewritten
    # A file there that is not this model (another zoo model, or junk) is replaced.
    other = tmp_path / "m.onnx"
    other.write_bytes(built["control-flow"].read_bytes())
    zoo.build("bert-tiny", other)
    assert onnx.load(str(other)).graph.input[0].name == "input_ids"
    other.write_bytes(b"junk")
    zoo.build("bert-tiny", other)
    onnx.checker.check_model(onnx.load(str(other)))


def test_build_torch_hands_out_independent_copies():
    a, (example,) = zoo.build_torch("resnet-digits")
    b, _ = zoo.build_torch("resnet-digits")
    with torch.no_grad():
        before = b(example).clone()
        for p in a.parameters():
            p.zero_()
        torch.testing.assert_close(b(example), before, rtol=0, atol=0)
    assert not a.training and not b.training


@pytest.mark.slow
def test_minilm_matches_its_torch_source_on_real_sentences(tmp_path):
    path = zoo.build("minilm", tmp_path / "minilm.onnx")
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto)
    assert proto.opset_import[0].version == 17
    module, _ = zoo.build_torch("minilm")
    for batch, seq in [(3, None), (8, 40)]:
        feeds = zoo.sample_inputs("minilm", batch=batch, seq=seq)
        assert feeds["attention_mask"].min() == 0  # padding is exercised
        got = run_model(path, feeds)["sentence_embedding"]
        with torch.no_grad():
            want = module(*(torch.from_numpy(v) for v in feeds.values())).numpy()
        d = compare_arrays("sentence_embedding", want, got, rtol=RTOL, atol=0.0)
        assert d.passed, f"max rel {d.max_rel:.3g}"
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)
