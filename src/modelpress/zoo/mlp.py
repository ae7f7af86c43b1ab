"""A wide MLP of any size, built from numbers alone: the model the memory checks of ``protect``
use (``tests/protect/test_memory.py``, ``benchmarks/protect_memory.py``), where only the size of
the weights matters."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def wide_mlp(path: Path, *, width: int, layers: int, seed: int = 0) -> Path:
    """``layers`` of MatMul ``[width, width]`` + Add + Relu, saved at ``path`` with its weights
    in ``<path>.data`` beside it."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((width, width), dtype=np.float32) / np.sqrt(width)).astype(
            np.float32
        )
        inits += [
            numpy_helper.from_array(w, f"w{i}"),
            numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), f"b{i}"),
        ]
        nodes += [
            helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
            helper.make_node("Relu", [f"a{i}"], [f"h{i}"]),
        ]
        x = f"h{i}"
    graph = helper.make_graph(
        nodes,
        "wide_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", width])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path), save_as_external_data=True, location=Path(path).name + ".data")
    return Path(path)
