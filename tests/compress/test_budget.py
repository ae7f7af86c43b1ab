"""Accuracy budget: the deliberately sensitive layer goes back to float and the budget holds."""

from __future__ import annotations

import numpy as np
import pytest
from quant_models import mlp

from modelpress.compress import quantize
from modelpress.runtime.ort import session


@pytest.fixture
def labelled(rng):
    model = mlp(sensitive=True)
    x = rng.standard_normal((256, 16)).astype(np.float32)
    labels = session(model).run(None, {"x": x})[0].argmax(axis=1)  # the float model scores 1.0
    return model, [{"x": x[i : i + 64], "label": labels[i : i + 64]} for i in range(0, 256, 64)]


def test_budget_keeps_the_sensitive_layer_in_float(labelled):
    model, data = labelled
    plain = quantize(model, mode="static", data=data, labels_key="label", max_accuracy_drop=1.0)
    assert plain.accuracy.metric_float == 1.0
    assert plain.accuracy.drop > 0.1  # per-tensor activations crush fc2's input
    r = quantize(model, mode="static", data=data, labels_key="label", max_accuracy_drop=0.02)
    assert r.accuracy.met and r.accuracy.drop <= 0.02
    assert r.accuracy.kept_float[0] == "fc2"
    layers = {layer.name: layer for layer in r.layers}
    assert not layers["fc2"].quantized and layers["fc3"].quantized
    # the per-layer report shows the collapse at that layer: noise as loud as the signal
    report = {layer.name: layer for layer in plain.layers}
    assert report["fc2"].sqnr_db < 10 and report["fc2"].rel_error > 0.3


def test_budget_with_a_callable_metric_and_best_effort(labelled):
    model, data = labelled
    x = np.concatenate([d["x"] for d in data])
    ref = session(model).run(None, {"x": x})[0]

    def closeness(run) -> float:  # higher is better
        return -float(np.abs(run({"x": x})["y"] - ref).max())

    data = [{"x": d["x"]} for d in data]
    # 4-bit weights fall back to 8 bits, never to float: an exact result is out of reach
    r = quantize(
        model,
        mode="weight-only",
        bits=4,
        block_size=16,
        data=data,
        max_accuracy_drop=0.0,
        metric=closeness,
    )
    assert not r.accuracy.met and r.accuracy.drop > 0
    # ... and the best model found is returned, with the search it came from
    assert r.accuracy.metric_quantized == max(v for _, v in r.accuracy.tried)
    assert len(r.accuracy.tried) >= 2 and r.accuracy.metric_quantized > r.accuracy.tried[0][1]


def test_layer_errors_ignore_padded_positions():
    from modelpress.compress.quantize.sensitivity import _token_mask

    feeds = {
        "input_ids": np.zeros((2, 3), np.int64),
        "attention_mask": np.array([[1, 1, 0], [1, 0, 0]]),
    }
    assert _token_mask(feeds).tolist() == [[True, True, False], [True, False, False]]
    assert _token_mask({"x": np.zeros((2, 3), np.float32)}) is None


def test_layer_errors_of_an_infinite_or_nan_output_are_reported_not_raised():
    """A 16-bit constant out of range made one layer's error infinite; ``log10(s / inf)`` raised,
    and the whole report was lost. That layer reads -inf dB, the others their own value."""
    from onnx import TensorProto, helper
    from quant_models import _model

    from modelpress.compress.quantize.sensitivity import layer_errors

    def model(c):
        nodes = [
            helper.make_node("Mul", ["x", "c"], ["a"], name="scale"),
            helper.make_node("Add", ["x", "one"], ["b"], name="shift"),
        ]
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
        outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in "ab"]
        return _model(nodes, [x], outs, {"c": np.float32(c), "one": np.float32(1.0)})

    feeds = [{"x": np.arange(1, 7, dtype=np.float32).reshape(2, 3)}]
    pairs = {"scale": ("a", "a"), "shift": ("b", "b")}
    for bad in (np.inf, np.nan):
        errs = layer_errors(model(1.0), model(bad), pairs, feeds)
        assert errs["scale"][0] == -np.inf
        assert errs["shift"] == (np.inf, 0.0)
