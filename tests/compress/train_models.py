"""Small graphs for the training-based compression tests, built with random weights.

Each builder returns an ``onnx_ir.Model`` (checked by the ONNX checker) and takes a seed. They cover
the structures the dependency analysis must follow: residual Adds, Concat and Split, BatchNorm,
depthwise and grouped Convs, Flatten into Gemm, and a transformer block (heads reshaped by
constant targets, LayerNorm, an FFN).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from modelpress.ir import from_proto


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.k = 0

    def name(self, hint: str) -> str:
        self.k += 1
        return f"{hint}{self.k}"

    def const(self, array: np.ndarray, hint: str = "w") -> str:
        n = self.name(hint)
        self.inits.append(onnx.numpy_helper.from_array(np.asarray(array), n))
        return n

    def node(self, op: str, inputs: list[str], n_out: int = 1, **attrs) -> list[str] | str:
        name = self.name(op.lower())
        outs = [f"{name}_out{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    def conv(
        self, x: str, cin: int, cout: int, k: int = 3, group: int = 1, bias: bool = True
    ) -> str:
        w = self.const(
            (self.rng.standard_normal((cout, cin // group, k, k)) * 0.3).astype(np.float32)
        )
        ins = [x, w]
        if bias:
            ins.append(self.const((self.rng.standard_normal(cout) * 0.1).astype(np.float32), "b"))
        return self.node("Conv", ins, pads=[k // 2] * 4, group=group, kernel_shape=[k, k])

    def bn(self, x: str, c: int) -> str:
        r = self.rng
        params = [
            (r.uniform(0.5, 1.5, c)).astype(np.float32),
            (r.standard_normal(c) * 0.1).astype(np.float32),
            (r.standard_normal(c) * 0.1).astype(np.float32),
            r.uniform(0.5, 1.5, c).astype(np.float32),
        ]
        return self.node("BatchNormalization", [x] + [self.const(p, "bn") for p in params])

    def matmul(self, x: str, k: int, n: int, bias: bool = True) -> str:
        w = self.const((self.rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32))
        y = self.node("MatMul", [x, w])
        if bias:
            y = self.node(
                "Add", [y, self.const((self.rng.standard_normal(n) * 0.1).astype(np.float32), "b")]
            )
        return y

    def model(self, inputs, outputs, opset: int = 17):
        graph = helper.make_graph(self.nodes, "g", inputs, outputs, self.inits)
        proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        proto.ir_version = 8
        onnx.checker.check_model(proto)
        return from_proto(proto)


def _image_input(c: int, hw: int):
    return helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", c, hw, hw])


def _logits(n: int):
    return helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", n])


def _head(b: _Builder, h: str, c: int, classes: int, *, flatten_spatial: int | None = None) -> None:
    if flatten_spatial is None:
        h = b.node("GlobalAveragePool", [h])
        h = b.node("Flatten", [h], axis=1)
        k = c
    else:
        h = b.node("Flatten", [h], axis=1)
        k = c * flatten_spatial
    w = b.const((b.rng.standard_normal((classes, k)) / np.sqrt(k)).astype(np.float32))
    bias = b.const(np.zeros(classes, np.float32), "b")
    b.nodes.append(helper.make_node("Gemm", [h, w, bias], ["y"], name="head", transB=1))


def residual_cnn(seed: int = 0):
    """stem Conv-BN-Relu (8), a residual block of two Conv-BNs added to the stem, a head."""
    b = _Builder(seed)
    s = b.node("Relu", [b.bn(b.conv("x", 3, 8), 8)])
    h = b.node("Relu", [b.bn(b.conv(s, 8, 6), 6)])
    h = b.bn(b.conv(h, 6, 8), 8)
    h = b.node("Relu", [b.node("Add", [h, s])])
    _head(b, h, 8, 4)
    return b.model([_image_input(3, 8)], [_logits(4)])


def concat_cnn(seed: int = 0):
    """A stem Split in two (3 + 5 channels), one part through a Conv, joined again by Concat with
    a third branch; then a Conv and a head."""
    b = _Builder(seed)
    s = b.node("Relu", [b.conv("x", 3, 8)])
    split = b.const(np.array([3, 5], np.int64), "split")
    p1, p2 = b.node("Split", [s, split], n_out=2, axis=1)
    p2 = b.node("Relu", [b.conv(p2, 5, 5)])
    p3 = b.node("Sigmoid", [b.conv("x", 3, 4, k=1)])
    h = b.node("Concat", [p1, p2, p3], axis=1)  # 12 channels
    h = b.node("Relu", [b.conv(h, 12, 6)])
    _head(b, h, 6, 4)
    return b.model([_image_input(3, 8)], [_logits(4)])


def depthwise_cnn(seed: int = 0):
    """Conv-BN-HardSwish, a depthwise 3x3 with BN, a pointwise Conv, a grouped Conv (2 groups),
    and the spatial map flattened straight into the head's Gemm."""
    b = _Builder(seed)
    h = b.node("HardSwish", [b.bn(b.conv("x", 3, 8), 8)])
    h = b.node("Relu", [b.bn(b.conv(h, 8, 8, group=8), 8)])
    h = b.node("Relu", [b.conv(h, 8, 12, k=1)])
    h = b.node("Relu", [b.conv(h, 12, 8, group=2)])
    h = b.node("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2])
    _head(b, h, 8, 4, flatten_spatial=16)
    return b.model([_image_input(3, 8)], [_logits(4)])


def transformer_block(
    seed: int = 0, *, hidden: int = 16, heads: int = 4, ffn: int = 32, exported: bool = False
):
    """One post-norm encoder block: Q/K/V projections split into heads by Reshapes with constant
    targets (the head count written in them), scaled dot-product attention, an output projection
    with a residual and LayerNormalization, an FFN (GELU as Erf), a residual and LayerNorm.

    ``exported``: the targets are built as exporters write them, ``Concat`` of the input's batch and
    sequence sizes (``Shape → Gather → Unsqueeze``) and constant pieces for the head count and size.
    """
    b = _Builder(seed)
    d = hidden // heads
    if exported:
        shape = b.node("Shape", ["x"])
        axes = b.const(np.array([0], np.int64), "axes")
        dims = [
            b.node(
                "Unsqueeze",
                [b.node("Gather", [shape, b.const(np.array(i, np.int64), "i")], axis=0), axes],
            )
            for i in (0, 1)
        ]
        split = b.node(
            "Concat",
            [
                *dims,
                b.const(np.array([heads], np.int64), "h"),
                b.const(np.array([d], np.int64), "d"),
            ],
            axis=0,
        )
        merge = b.node("Concat", [*dims, b.const(np.array([hidden], np.int64), "m")], axis=0)
    else:
        split = b.const(np.array([0, 0, heads, d], np.int64), "shape")
        merge = b.const(np.array([0, 0, hidden], np.int64), "shape")

    def heads_of(x: str, perm: list[int]) -> str:
        return b.node("Transpose", [b.node("Reshape", [x, split])], perm=perm)

    q = heads_of(b.matmul("x", hidden, hidden), [0, 2, 1, 3])
    k = heads_of(b.matmul("x", hidden, hidden), [0, 2, 3, 1])
    v = heads_of(b.matmul("x", hidden, hidden), [0, 2, 1, 3])
    scores = b.node(
        "Mul", [b.node("MatMul", [q, k]), b.const(np.array(1 / np.sqrt(d), np.float32), "scale")]
    )
    probs = b.node("Softmax", [scores], axis=-1)
    ctx = b.node("Transpose", [b.node("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    ctx = b.node("Reshape", [ctx, merge])
    h = b.node("Add", [b.matmul(ctx, hidden, hidden), "x"])
    gamma = b.const(np.ones(hidden, np.float32), "ln")
    beta = b.const(np.zeros(hidden, np.float32), "ln")
    h = b.node("LayerNormalization", [h, gamma, beta], axis=-1)
    f = b.matmul(h, hidden, ffn)
    gelu = b.node(
        "Mul",
        [
            f,
            b.node(
                "Add",
                [
                    b.node(
                        "Erf", [b.node("Div", [f, b.const(np.array(1.4142135, np.float32), "c")])]
                    ),
                    b.const(np.array(1.0, np.float32), "c"),
                ],
            ),
        ],
    )
    f = b.matmul(gelu, ffn, hidden)
    out = b.node("Add", [f, h])
    b.nodes.append(
        helper.make_node(
            "LayerNormalization",
            [
                out,
                b.const(np.ones(hidden, np.float32), "ln"),
                b.const(np.zeros(hidden, np.float32), "ln"),
            ],
            ["y"],
            name="final_ln",
            axis=-1,
        )
    )
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", hidden])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", hidden])
    return b.model([x], [y])


def image_batch(
    rng: np.random.Generator, n: int = 4, c: int = 3, hw: int = 8
) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal((n, c, hw, hw)).astype(np.float32)}


def token_batch(
    rng: np.random.Generator, n: int = 2, s: int = 5, hidden: int = 16
) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal((n, s, hidden)).astype(np.float32)}
