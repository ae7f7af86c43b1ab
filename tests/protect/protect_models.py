"""Models the protect tests run (an LSTM built here; the others come from the zoo) and their
inputs."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from modelpress import zoo

ZOO = ["resnet-digits", "bert-tiny", "control-flow"]


def lstm_proto(seq: int = 5, features: int = 8, hidden: int = 16) -> onnx.ModelProto:
    """A one-layer LSTM followed by a linear head, random weights (fixed seed)."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((1, 4 * hidden, features)).astype(np.float32) * 0.3
    r = rng.standard_normal((1, 4 * hidden, hidden)).astype(np.float32) * 0.3
    b = rng.standard_normal((1, 8 * hidden)).astype(np.float32) * 0.1
    head = rng.standard_normal((hidden, 3)).astype(np.float32)
    nodes = [
        helper.make_node("LSTM", ["x", "W", "R", "B"], ["all_h", "last_h"], hidden_size=hidden),
        helper.make_node("Squeeze", ["last_h", "axes0"], ["h"]),
        helper.make_node("MatMul", ["h", "head"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "lstm_classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, "batch", features])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
        [
            numpy_helper.from_array(a, n)
            for a, n in (
                (w, "W"),
                (r, "R"),
                (b, "B"),
                (head, "head"),
                (np.array([0], np.int64), "axes0"),
            )
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def lstm_inputs(batch: int = 3) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(4).standard_normal((5, batch, 8)).astype(np.float32)}


def sample_inputs(name: str, batch: int = 3) -> dict[str, np.ndarray]:
    if name == "lstm":
        return lstm_inputs(batch)
    return zoo.sample_inputs(name, batch=batch, seq=16 if name == "bert-tiny" else None)
