"""The graph under construction: nodes, initializers, shared constants, and the two pieces every
level builds the same way (a linear layer as a MatMul against an ``[in, out]`` initializer, and a
norm as one RMSNormalization or LayerNormalization node)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from modelpress.convert.llm.families import Spec

OPSET = 23
MS = "com.microsoft"  # ONNX Runtime's contrib ops (the ``ort`` level)
MASKED = float(np.finfo(np.float32).min)


def matmul_weight_name(prefix: str) -> str:
    return f"{prefix}.MatMul.weight"


class Graph:
    def __init__(self):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0
        self._consts: dict[tuple, str] = {}

    def op(self, op_type: str, inputs: list[str], *, name: str = "", outputs: int = 1, **attrs):
        self._n += 1
        base = name or f"{op_type}_{self._n}"
        outs = [f"{base}/out{k}" if outputs > 1 else f"{base}/out" for k in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=base, **attrs))
        return outs if outputs > 1 else outs[0]

    def init(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def const(self, value, dtype=np.int64) -> str:
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            self._consts[key] = self.init(f"const_{len(self._consts)}", arr)
        return self._consts[key]


def linear(g: Graph, x: str, prefix: str, w: np.ndarray, b: np.ndarray | None) -> str:
    """``x @ w.T + b`` with ``w`` ``[out, in]`` stored transposed as the MatMul's ``[in, out]``."""
    y = g.op("MatMul", [x, g.init(matmul_weight_name(prefix), w.T)], name=f"{prefix}/MatMul")
    if b is not None:
        y = g.op("Add", [y, g.init(f"{prefix}.bias", b)], name=f"{prefix}/Add")
    return y


def qkv_projection(g: Graph, x: str, prefix: str, w: dict, sizes: tuple[int, int, int]) -> str:
    """q, k and v as one MatMul (``{prefix}.qkv_proj``), their biases (zeros where a family has
    none for one of them) as one Add."""
    weight = np.concatenate([w["q"], w["k"], w["v"]], axis=0)
    biases = [w.get(n + "_bias") for n in ("q", "k", "v")]
    bias = None
    if any(b is not None for b in biases):
        bias = np.concatenate(
            [b if b is not None else np.zeros(n, np.float32) for b, n in zip(biases, sizes)]
        )
    return linear(g, x, f"{prefix}.qkv_proj", weight, bias)


def norm(g: Graph, spec: Spec, x: str, name: str, w: np.ndarray, b: np.ndarray | None) -> str:
    weight = g.init(f"{name}.weight", (w + np.float32(spec.norm_offset)).astype(np.float32))
    if spec.norm == "rms":
        return g.op("RMSNormalization", [x, weight], name=name, axis=-1, epsilon=spec.norm_eps)
    bias = g.init(f"{name}.bias", b) if b is not None else None
    inputs = [x, weight] + ([bias] if bias else [])
    return g.op("LayerNormalization", inputs, name=name, axis=-1, epsilon=spec.norm_eps)


def head_norms(g: Graph, spec: Spec, q: str, k: str, w: dict, p: str) -> tuple[str, str]:
    """Qwen3/Gemma3's RMSNorm over each head of ``q`` and ``k``: to [B, S, heads, head_dim], the
    norm, and back to [B, S, heads * head_dim]."""
    nh, kvh, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    q = g.op("Reshape", [q, g.const([0, 0, nh, d])], name=f"{p}/q_heads")
    k = g.op("Reshape", [k, g.const([0, 0, kvh, d])], name=f"{p}/k_heads")
    q = norm(g, spec, q, f"{p}.q_norm", w["q_norm"], None)
    k = norm(g, spec, k, f"{p}.k_norm", w["k_norm"], None)
    q = g.op("Reshape", [q, g.const([0, 0, nh * d])], name=f"{p}/q_merge")
    k = g.op("Reshape", [k, g.const([0, 0, kvh * d])], name=f"{p}/k_merge")
    return q, k
