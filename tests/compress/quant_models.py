"""Small models for the quantization tests, built with onnx.helper (fixed seeds)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from modelpress.ir import from_proto


def image_like(rng, shape: tuple[int, ...]) -> np.ndarray:
    """Gaussian inputs whose samples differ in contrast (0.2x to 3x), as images do: samples of
    one distribution would make a CNN's pooled features, and so its outputs, nearly constant
    across the set."""
    contrast = rng.uniform(0.2, 3.0, (shape[0],) + (1,) * (len(shape) - 1))
    return (rng.standard_normal(shape) * contrast).astype(np.float32)


def _conv_w(rng, cout: int, cin: int, k: int, gain: float = 1.0) -> np.ndarray:
    """Conv weights [cout, cin, k, k] that keep activations' variance (times ``gain``²)."""
    w = rng.standard_normal((cout, cin, k, k)) * gain / np.sqrt(cin * k * k)
    return w.astype(np.float32)


def _model(nodes, inputs, outputs, inits, opset=17):
    graph = helper.make_graph(
        nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()]
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = 9
    onnx.checker.check_model(proto)
    return from_proto(proto)


def small_cnn(seed: int = 0):
    """x[N,4,8,8] → Conv 3x3 (32 channels) → Relu → Conv 3x3 → Add(residual) → Relu → GlobalAveragePool → Flatten → Gemm."""
    rng = np.random.default_rng(seed)
    inits = {
        "w1": (rng.standard_normal((32, 4, 3, 3)) * 0.3).astype(np.float32),
        "b1": (rng.standard_normal(32) * 0.1).astype(np.float32),
        "w2": (rng.standard_normal((32, 32, 3, 3)) * 0.1).astype(np.float32),
        "b2": (rng.standard_normal(32) * 0.1).astype(np.float32),
        "wf": (rng.standard_normal((5, 32)) * 0.5).astype(np.float32),
        "bf": (rng.standard_normal(5) * 0.1).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Add", ["c2", "r1"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1, name="fc"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])
    return _model(nodes, [x], [y], inits)


def probe_head_cnn(seed: int = 0):
    """``small_cnn`` with a head like a linear probe fitted on its pooled features: the features
    share a large common part (a bias of 10 before the last Relu) and vary little around it, and
    the head's large weights cancel the common part (rows of zero sum), so its outputs are small
    differences of large terms, which 8-bit inputs disturb."""
    model = small_cnn(seed)
    rng = np.random.default_rng(seed + 100)
    inits = model.graph.initializers
    inits["b2"].const_value = ir.tensor(np.full(32, 10.0, np.float32))
    wf = rng.standard_normal((5, 32)) * 20
    inits["wf"].const_value = ir.tensor((wf - wf.mean(axis=1, keepdims=True)).astype(np.float32))
    return model


def embedding_model(rng, *, width: int = 16, opset: int = 17):
    """ids[N,8] → Gather of a 4096x32 table (named ``embed``) → MatMul [32, width] (``fc``)."""
    table = rng.standard_normal((4096, 32)).astype(np.float32)
    w = (rng.standard_normal((32, width)) * 0.2).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
        helper.make_node("MatMul", ["e", "w"], ["y"], name="fc"),
    ]
    ids_info = helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 8])
    y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, width])
    return _model(nodes, [ids_info], [y_info], {"table": table, "w": w}, opset=opset)


def single_conv(seed: int = 0):
    rng = np.random.default_rng(seed)
    inits = {
        "w": (rng.standard_normal((6, 4, 3, 3)) * 0.3).astype(np.float32),
        "b": (rng.standard_normal(6) * 0.1).astype(np.float32),
    }
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], name="conv")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 6, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6, 6, 6])
    return _model(nodes, [x], [y], inits)


def mlp(seed: int = 0, *, sensitive: bool = False):
    """x[N,16] → MatMul(16x32) + b → Relu → MatMul(32x32) → Relu → MatMul(32x10).

    ``sensitive``: the second layer's input gets one channel 1000x larger than the others (a scale
    folded into the first layer's weights and undone in the second's), so per-tensor activation
    quantization of that layer wipes out every other channel, while the float model is unchanged.
    """
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((16, 32)) * 0.4).astype(np.float32)
    b1 = (np.abs(rng.standard_normal(32)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((32, 32)) * 0.3).astype(np.float32)
    w3 = (rng.standard_normal((32, 10)) * 0.5).astype(np.float32)
    if sensitive:
        big = np.ones(32, np.float32)
        big[0] = 1000.0
        w1 = w1 * big
        b1 = b1 * big
        w2 = w2 / big[:, None]
    inits = {"w1": w1, "b1": b1, "w2": w2, "w3": w3}
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"], name="fc1"),
        helper.make_node("Add", ["m1", "b1"], ["h1"], name="bias1"),
        helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
        helper.make_node("MatMul", ["r1", "w2"], ["m2"], name="fc2"),
        helper.make_node("Relu", ["m2"], ["r2"], name="relu2"),
        helper.make_node("MatMul", ["r2", "w3"], ["y"], name="fc3"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])
    return _model(nodes, [x], [y], inits)


def thin_stem_cnn(seed: int = 0, *, residual: bool = False):
    """x[N,1,8,8] → Conv 3x3 1→16 (reduction 9: too short for int8) → Relu → Conv 3x3 → Add (of
    the stem's output with ``residual``, else of the Conv's output with itself) → Relu → MaxPool →
    Conv 3x3 → Relu → GlobalAveragePool → Flatten → Gemm."""
    rng = np.random.default_rng(seed)
    inits = {
        "w0": (rng.standard_normal((16, 1, 3, 3)) * 0.5).astype(np.float32),
        "b0": (rng.standard_normal(16) * 0.1).astype(np.float32),
        "w1": (rng.standard_normal((16, 16, 3, 3)) * 0.15).astype(np.float32),
        "b1": (rng.standard_normal(16) * 0.1).astype(np.float32),
        "w2": (rng.standard_normal((24, 16, 3, 3)) * 0.15).astype(np.float32),
        "b2": (rng.standard_normal(24) * 0.1).astype(np.float32),
        "wf": (rng.standard_normal((5, 24)) * 0.5).astype(np.float32),
        "bf": (rng.standard_normal(5) * 0.1).astype(np.float32),
    }
    pads = [1, 1, 1, 1]
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=pads, name="stem"),
        helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
        helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], pads=pads, name="conv1"),
        helper.make_node("Add", ["c1", "r0" if residual else "c1"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["m"], kernel_shape=[2, 2], strides=[2, 2], name="mp"),
        helper.make_node("Conv", ["m", "w2", "b2"], ["c2"], pads=pads, name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1, name="fc"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])
    return _model(nodes, [x], [y], inits)


def transformer_ffn(seed: int = 0):
    """x[N,T,32] → LayerNorm → MatMul(32x64) + b → Relu → MatMul(64x32) → Add(x): a transformer's
    feed-forward block whose LayerNorm output has two outlier channels (gamma 40x) read by small
    weights (rows / 40), as BERT's are: every channel matters to the product equally."""
    rng = np.random.default_rng(seed)
    gamma = np.ones(32, np.float32)
    gamma[[3, 17]] = 40.0
    beta = (rng.standard_normal(32) * 0.1).astype(np.float32)
    w1 = (rng.standard_normal((32, 64)) * 0.2 / gamma[:, None]).astype(np.float32)
    b1 = (rng.standard_normal(64) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((64, 32)) * 0.2).astype(np.float32)
    inits = {"gamma": gamma, "beta": beta, "w1": w1, "b1": b1, "w2": w2}
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln"], name="ln", axis=-1),
        helper.make_node("MatMul", ["ln", "w1"], ["m1"], name="fc1"),
        helper.make_node("Add", ["m1", "b1"], ["h1"], name="bias1"),
        helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
        helper.make_node("MatMul", ["r1", "w2"], ["m2"], name="fc2"),
        helper.make_node("Add", ["m2", "x"], ["y"], name="residual"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 32])
    return _model(nodes, [x], [y], inits)


def swish_se_cnn(seed: int = 0):
    """x[N,4,8,8] → Conv(16) → SiLU (x·Sigmoid(x)) → squeeze-excite (GlobalAveragePool → Conv →
    LeakyRelu → Conv → Sigmoid → Mul) → nearest Resize 2x → Slice (crop) → Conv(16) → Relu: the ops an
    EfficientNet or a U-Net decoder adds to a plain CNN."""
    rng = np.random.default_rng(seed)

    inits = {
        "w1": _conv_w(rng, 16, 4, 3),
        "b1": (rng.standard_normal(16) * 0.1).astype(np.float32),
        "se1": _conv_w(rng, 16, 16, 1),  # reductions of at least 16: int8 pays off (select_layers)
        "se2": _conv_w(rng, 16, 16, 1),
        "w2": _conv_w(rng, 16, 16, 3),
        "sizes": np.array([0, 16, 16, 16], np.int64),
        "starts": np.array([1, 1], np.int64),
        "ends": np.array([15, 15], np.int64),
        "axes": np.array([2, 3], np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c1"], ["g1"], name="sig1"),
        helper.make_node("Mul", ["c1", "g1"], ["a1"], name="silu1"),
        helper.make_node("GlobalAveragePool", ["a1"], ["p"], name="pool"),
        helper.make_node("Conv", ["p", "se1"], ["s1"], name="se_reduce"),
        helper.make_node("LeakyRelu", ["s1"], ["s2"], name="se_act", alpha=0.1),
        helper.make_node("Conv", ["s2", "se2"], ["s3"], name="se_expand"),
        helper.make_node("Sigmoid", ["s3"], ["s4"], name="se_gate"),
        helper.make_node("Mul", ["a1", "s4"], ["e"], name="excite"),
        helper.make_node("Resize", ["e", "", "", "sizes_n"], ["u"], name="up", mode="nearest"),
        helper.make_node("Slice", ["u", "starts", "ends", "axes"], ["cr"], name="crop"),
        helper.make_node("Conv", ["cr", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["y"], name="out_relu"),
    ]
    # Resize's sizes need the batch dimension: Shape(x)[0] joined with the constant rest
    nodes[9:9] = [
        helper.make_node("Shape", ["x"], ["xs"], name="shape", end=1),
        helper.make_node("Slice", ["sizes", "one", "four"], ["rest"], name="sizes_rest"),
        helper.make_node("Concat", ["xs", "rest"], ["sizes_n"], name="sizes_cat", axis=0),
    ]
    inits["one"], inits["four"] = np.array([1], np.int64), np.array([4], np.int64)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 14, 14])
    return _model(nodes, [x], [y], inits, opset=19)


def hardswish_se_cnn(seed: int = 0):
    """x[N,4,8,8] → Conv(16) → HardSwish → depthwise Conv 3x3 → squeeze-excite (GlobalAveragePool →
    Conv → Relu → Conv → HardSigmoid(1/6, 1/2) → Mul) → Conv(16) → HardSigmoid(0.2, -0.1): the
    activations of a MobileNetV3 (the last one with a negative offset)."""
    rng = np.random.default_rng(seed)

    inits = {
        "w1": _conv_w(rng, 16, 4, 3),
        "b1": (rng.standard_normal(16) * 0.5).astype(np.float32),
        "dw": (rng.standard_normal((16, 1, 3, 3)) / 3).astype(np.float32),
        "se1": _conv_w(rng, 16, 16, 1),
        "se2": _conv_w(rng, 16, 16, 1),
        "w2": _conv_w(rng, 16, 16, 3) * 3,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("HardSwish", ["c1"], ["a1"], name="hswish1"),
        helper.make_node("Conv", ["a1", "dw"], ["d"], name="dwconv", group=16, pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["d"], ["p"], name="pool"),
        helper.make_node("Conv", ["p", "se1"], ["s1"], name="se_reduce"),
        helper.make_node("Relu", ["s1"], ["s2"], name="se_relu"),
        helper.make_node("Conv", ["s2", "se2"], ["s3"], name="se_expand"),
        helper.make_node("HardSigmoid", ["s3"], ["s4"], name="se_gate", alpha=1 / 6, beta=0.5),
        helper.make_node("Mul", ["d", "s4"], ["e"], name="excite"),
        helper.make_node("Conv", ["e", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("HardSigmoid", ["c2"], ["h"], name="out_gate", alpha=0.2, beta=-0.1),
        helper.make_node("Conv", ["h", "w2"], ["y"], name="head", pads=[1, 1, 1, 1]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 8, 8])
    return _model(nodes, [x], [y], inits, opset=17)


def shuffle_cnn(seed: int = 0):
    """A ShuffleNet-V2 unit: x[N,8,8,8] → Conv(16) → Relu → split in two by Slice; one half passes,
    the other goes through Conv → Relu; Concat → channel shuffle (Reshape [N,2,8,8,8] → Transpose
    → Reshape [N,16,8,8]) → Slice → Conv → Relu, twice."""
    rng = np.random.default_rng(seed)
    he = np.sqrt(2)  # He init: Relu halves the variance
    inits = {
        "w0": _conv_w(rng, 16, 8, 3, he),
        "w1": _conv_w(rng, 8, 8, 3, he),
        "w2": _conv_w(rng, 8, 8, 3, he),
        "w3": _conv_w(rng, 16, 16, 3, he),
        "g": np.array([0, 2, 8, 8, 8], np.int64),
        "f": np.array([0, 16, 8, 8], np.int64),
        "s0": np.array([0], np.int64),
        "s8": np.array([8], np.int64),
        "s16": np.array([16], np.int64),
        "ax": np.array([1], np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], name="stem", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"], name="stem_relu"),
    ]
    src = "r0"
    for i, w in ((1, "w1"), (2, "w2")):
        nodes += [
            helper.make_node("Slice", [src, "s0", "s8", "ax"], [f"keep{i}"], name=f"keep{i}"),
            helper.make_node("Slice", [src, "s8", "s16", "ax"], [f"work{i}"], name=f"work{i}"),
            helper.make_node(
                "Conv", [f"work{i}", w], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]
            ),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"),
            helper.make_node("Concat", [f"keep{i}", f"r{i}"], [f"cat{i}"], name=f"cat{i}", axis=1),
            helper.make_node("Reshape", [f"cat{i}", "g"], [f"g{i}"], name=f"group{i}"),
            helper.make_node(
                "Transpose", [f"g{i}"], [f"t{i}"], name=f"shuffle{i}", perm=[0, 2, 1, 3, 4]
            ),
            helper.make_node("Reshape", [f"t{i}", "f"], [f"sh{i}"], name=f"flat{i}"),
        ]
        src = f"sh{i}"
    nodes += [
        helper.make_node("Conv", [src, "w3"], ["c3"], name="head", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c3"], ["y"], name="head_relu"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 8, 8])
    return _model(nodes, [x], [y], inits, opset=17)


def dense_cnn(
    seed: int = 0,
    *,
    channels: int = 32,
    relu_before: bool = False,
    shared: bool = False,
    relu6: bool = False,
):
    """DenseNet's pre-activation unit: two 3x3 Convs → Concat → BatchNorm as a per-channel Mul +
    Add (which the optimizer cannot fold: a Relu sits between it and the next Conv) → Relu → Conv.
    ``relu_before``: an Inception-style Relu between the Concat and the BatchNorm. ``shared``: the
    first Conv's output is also a graph output, read by more than the Concat. ``relu6``: a
    Clip(0, 6) instead of the Relu after the BatchNorm."""
    rng = np.random.default_rng(seed)
    half = channels // 2
    inits = {
        "w0": _conv_w(rng, half, 8, 3),
        "w1": _conv_w(rng, half, 8, 3, gain=3.0),  # the two halves' ranges differ
        "gamma": rng.uniform(0.5, 2.0, (channels, 1, 1)).astype(np.float32),
        "beta": (rng.standard_normal((channels, 1, 1)) * 0.3).astype(np.float32),
        "w2": _conv_w(rng, 16, channels, 3),
        "lo": np.array(0.0, np.float32),
        "hi": np.array(6.0, np.float32),
    }
    cat = "cat_r" if relu_before else "cat"
    act = (
        helper.make_node("Clip", ["bn", "lo", "hi"], ["r"], name="relu")
        if relu6
        else helper.make_node("Relu", ["bn"], ["r"], name="relu")
    )
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["c0", "c1"], ["cat"], name="cat", axis=1),
        *([helper.make_node("Relu", ["cat"], ["cat_r"], name="cat_relu")] if relu_before else []),
        helper.make_node("Mul", [cat, "gamma"], ["bn_scaled"], name="bn_scale"),
        helper.make_node("Add", ["bn_scaled", "beta"], ["bn"], name="bn_shift"),
        act,
        helper.make_node("Conv", ["r", "w2"], ["y"], name="head", pads=[1, 1, 1, 1]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 8, 8])
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 8, 8])]
    if shared:
        outs.append(helper.make_tensor_value_info("c0", TensorProto.FLOAT, ["N", half, 8, 8]))
    return _model(nodes, [x], outs, inits)


def mbconv_cnn(seed: int = 0, *, hidden: int = 72, se: bool = False, stride: int = 1):
    """An inverted-residual block (MobileNetV2/MnasNet; with ``se``, MobileNetV3's): x[N,24,8,8] →
    Conv 1x1 (``hidden``, bias) → Relu → depthwise Conv 3x3 (bias) → Relu [→ squeeze-excite:
    GlobalAveragePool → Conv → Relu → Conv → HardSigmoid → Mul] → Conv 1x1 (24) → Add(x) (stride 1)
    → GlobalAveragePool → Flatten → Gemm(10)."""
    rng = np.random.default_rng(seed)
    h = hidden
    inits = {
        "w_exp": _conv_w(rng, h, 24, 1),
        "b_exp": (rng.standard_normal(h) * 0.2).astype(np.float32),
        "w_dw": (rng.standard_normal((h, 1, 3, 3)) / 3).astype(np.float32),
        "b_dw": (rng.standard_normal(h) * 0.2).astype(np.float32),
        "w_proj": _conv_w(rng, 24, h, 1),
        "w_fc": (rng.standard_normal((24, 10)) / np.sqrt(24)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w_exp", "b_exp"], ["e"], name="expand"),
        helper.make_node("Relu", ["e"], ["e_r"], name="expand_relu"),
        helper.make_node(
            "Conv",
            ["e_r", "w_dw", "b_dw"],
            ["d"],
            name="dw",
            group=h,
            pads=[1, 1, 1, 1],
            strides=[stride, stride],
        ),
        helper.make_node("Relu", ["d"], ["d_r"], name="dw_relu"),
    ]
    last = "d_r"
    if se:
        inits["w_se1"] = _conv_w(rng, 8, h, 1)
        inits["w_se2"] = _conv_w(rng, h, 8, 1)
        nodes += [
            helper.make_node("GlobalAveragePool", ["d_r"], ["s0"], name="se_pool"),
            helper.make_node("Conv", ["s0", "w_se1"], ["s1"], name="se_reduce"),
            helper.make_node("Relu", ["s1"], ["s2"], name="se_relu"),
            helper.make_node("Conv", ["s2", "w_se2"], ["s3"], name="se_expand"),
            helper.make_node("HardSigmoid", ["s3"], ["s4"], name="se_gate", alpha=1 / 6, beta=0.5),
            helper.make_node("Mul", ["d_r", "s4"], ["se_out"], name="excite"),
        ]
        last = "se_out"
    nodes.append(helper.make_node("Conv", [last, "w_proj"], ["p"], name="project"))
    if stride == 1:
        nodes.append(helper.make_node("Add", ["p", "x"], ["res"], name="residual"))
    nodes += [
        helper.make_node("GlobalAveragePool", ["res" if stride == 1 else "p"], ["g"], name="pool"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w_fc"], ["y"], name="fc"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 24, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])
    return _model(nodes, [x], [y], inits, opset=17)


def rgb_stem_cnn(seed: int = 0, *, filters: int = 16, pool: bool = False):
    """x[N,3,16,16] → Conv 3x3 (``filters``, the stem) → Relu [→ MaxPool 2x2] → Conv 3x3 (32) →
    Relu → GlobalAveragePool → Flatten → Gemm(10)."""
    rng = np.random.default_rng(seed)
    inits = {
        "w_stem": _conv_w(rng, filters, 3, 3),
        "w1": _conv_w(rng, 32, filters, 3),
        "w_fc": (rng.standard_normal((32, 10)) / np.sqrt(32)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w_stem"], ["s"], name="stem", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["s"], ["s_r"], name="stem_relu"),
    ]
    last = "s_r"
    if pool:
        nodes.append(
            helper.make_node(
                "MaxPool", ["s_r"], ["mp"], name="pool", kernel_shape=[2, 2], strides=[2, 2]
            )
        )
        last = "mp"
    nodes += [
        helper.make_node("Conv", [last, "w1"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["c_r"], name="relu1"),
        helper.make_node("GlobalAveragePool", ["c_r"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w_fc"], ["y"], name="fc"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])
    return _model(nodes, [x], [y], inits, opset=17)
