"""Placement plans for declared device sets, pins, fallback, and split execution with copies."""

from __future__ import annotations

import numpy as np
import pytest
from mp_testing import model_from_text

from modelpress.errors import InputError, OptionError
from modelpress.runtime.devices import DeviceError, choose
from modelpress.runtime.ort_backend import OrtBackend
from modelpress.runtime.placement import parse_pins, plan
from modelpress.runtime.session import Session
from modelpress.verify import run_model

TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 3] x) => (float[2, 3] y) <float[3] b = {1, 2, 3}> {
  a = Relu(x)
  n = Add(a, b)
  y = Sigmoid(n)
}
"""


def named_model():
    model = model_from_text(TEXT)
    for name, node in zip(["/enc/relu", "/enc/add", "/head/sigmoid"], model.graph):
        node.name = name
    return model


class DeclaredGpuBackend(OrtBackend):
    """ORT on the CPU that declares a GPU: plans see two devices, execution stays correct here."""

    def devices(self):
        return ["cuda:0", "cpu"]

    def prepare(self, model, *, device="cpu"):
        prepared = super().prepare(model, device="cpu")
        prepared.device = device
        return prepared


def test_graph_split_in_two_with_the_right_copies():
    p = plan(
        named_model(),
        device="cuda:0",
        available=["cuda:0", "cpu"],
        pins=parse_pins(["Sigmoid=cpu"]),
    )
    assert [(s.device, s.nodes) for s in p.segments] == [
        ("cuda:0", ["/enc/relu", "/enc/add"]),
        ("cpu", ["/head/sigmoid"]),
    ]
    copies = [(c.value, c.src, c.dst, c.nbytes) for c in p.copies]
    # x goes host→GPU, n comes back for the CPU segment; y is produced on the CPU: no copy.
    assert copies == [("x", "cpu", "cuda:0", 24), ("n", "cuda:0", "cpu", 24)]
    assert p.segments[1].inputs == ["n"] and p.segments[0].outputs == ["n"]


def test_glob_pins_on_node_names_and_first_pin_wins():
    pins = parse_pins(["/enc/*=cpu", "Relu=cuda:0"])
    p = plan(named_model(), device="cuda:0", available=["cuda:0", "cpu"], pins=pins)
    assert [d for _, _, d in p.assignments] == ["cpu", "cpu", "cuda:0"]
    assert "copy y: cuda:0 -> cpu (24 B)" in p.log_lines()


def test_soft_fallback_when_cuda_is_missing():
    sess = Session(named_model(), backend="ort", device="cuda")
    assert sess.device == "cpu"
    assert len(sess.warnings) == 1 and "'cuda' is not available" in sess.warnings[0]
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(
        sess.run({"x": x})["y"], 1 / (1 + np.exp(-(np.maximum(x, 0) + [1, 2, 3]))), rtol=1e-6
    )


def test_strict_placement_is_an_error():
    with pytest.raises(DeviceError, match="'cuda:1' is not available"):
        Session(named_model(), device="cuda:1", strict=True)
    with pytest.raises(DeviceError):
        choose("mps", ["cpu"], strict=True)


def test_auto_picks_the_best_device_present():
    assert choose("auto", ["cuda:0", "cpu"]).device == "cuda:0"
    assert choose("auto", ["cpu"]).device == "cpu"


def test_split_execution_matches_the_whole_graph_and_counts_copies():
    model = named_model()
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    sess = Session(model, backend=DeclaredGpuBackend(), device="cuda:0", place=["Add=cpu"])
    assert len(sess.plan.segments) == 3
    out = sess.run({"x": x})
    np.testing.assert_allclose(out["y"], run_model(model, {"x": x})["y"], rtol=1e-6)
    # x in, a to the CPU, n back to the GPU, y out: four 24-byte hand-overs
    assert sess.copied_bytes == 4 * 24


def test_split_graph_with_subgraph_capturing_outer_values():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (bool c, float[2] x) => (float[2] y) {
      r = Relu(x)
      y = If(c) <then_branch = t () => (float[2] a) { a = Neg(r) },
                 else_branch = e () => (float[2] b) { b = Abs(r) }>
    }
    """
    model = model_from_text(text)
    sess = Session(model, backend=DeclaredGpuBackend(), device="cuda:0", place=["If=cpu"])
    assert sess.plan.segments[1].inputs == ["c", "r"]
    x = np.array([1.0, -2.0], np.float32)
    np.testing.assert_array_equal(sess.run({"c": np.array(True), "x": x})["y"], [-1.0, 0.0])


@pytest.mark.parametrize(
    "feeds, message",
    [
        ({}, "missing input 'x'"),
        ({"x": np.zeros((2, 3), np.float64)}, "input 'x' has dtype float64"),
        ({"x": np.zeros((2, 3, 1), np.float32)}, "input 'x' has rank 3"),
        ({"x": np.zeros((2, 3), np.float32), "z": np.zeros(1)}, "'z' is not an input"),
    ],
)
def test_bad_inputs_name_the_input(feeds, message):
    with pytest.raises(InputError, match=message):
        Session(named_model(), device="cpu").run(feeds)


def test_bad_pin_and_device_strings():
    with pytest.raises(OptionError, match="PATTERN=DEVICE"):
        parse_pins(["Relu"])
    with pytest.raises(OptionError, match="cuda:N"):
        parse_pins(["Relu=cuda:x"])
