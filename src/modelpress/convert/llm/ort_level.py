"""The ``ort`` level: the decoder's attention and norms as ONNX Runtime's contrib ops.

Opt-in (``level="ort"``), for speed on ONNX Runtime only. Same inputs and outputs as the standard
level, but ``kv_layout`` is ``left_aligned`` (``modelpress.ir.llm``): each row's mask is ones
followed by zeros, and its new keys and values are written right after its real ones.

- ``GroupQueryAttention`` per layer: q|k|v packed in one input (apart for Gemma 3, whose q/k norms
  come first), rope inside the op (``do_rotary``) from cos/sin tables of ``max_context`` rows,
  the scale, soft-capping and the sliding window (``local_window_size``; checked against
  transformers' window, which counts the query itself). Its inputs shared by every layer: ``seqlens_k = sum(mask) - 1`` per row and
  ``total_sequence_length`` = the mask's width. A token's rope position is its index in its row
  (``position_ids`` is not read: under this layout it is that index).
- ``SkipSimplifiedLayerNormalization`` / ``SkipLayerNormalization``: each residual add with the
  norm after it (``builder._Stream``).

Phi-3's long rope factors are a second pair of tables, chosen when the longest row reaches
``original_max_position_embeddings`` (as the standard level does).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from modelpress.convert.llm.families import Spec
from modelpress.convert.llm.graph import head_norms, linear, qkv_projection
from modelpress.convert.llm.rope import Rope
from modelpress.errors import ConversionError
from modelpress.ir.llm import ATTENTION_MASK, past_names, present_names

MS = "com.microsoft"


def _tables(rope: Rope, inv: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
    positions = np.arange(rows, dtype=np.float32)
    freqs = np.outer(positions, inv).astype(np.float32)  # as transformers: float32 products
    scale = np.float32(rope.attention_scaling)
    return (np.cos(freqs) * scale).astype(np.float32), (np.sin(freqs) * scale).astype(np.float32)


class OrtShared:
    """What every GroupQueryAttention reads: per-row lengths, the total length, rope tables."""

    def __init__(self, g, spec: Spec):
        half = spec.rotary_dim // 2
        if spec.positions == "rope" and (half % 8 or half > spec.head_dim // 2):
            raise ConversionError(
                f"level 'ort': GroupQueryAttention rotates a multiple of 16 dimensions per head, "
                f"this {spec.family} model rotates {spec.rotary_dim}; use level 'standard'"
            )
        self.g, self.spec = g, spec
        self._rope: dict[tuple, tuple[str, str]] = {}
        ones = g.op("ReduceSum", [ATTENTION_MASK, g.const([1])], name="gqa/ones", keepdims=0)
        last = g.op("Sub", [ones, g.const(1)], name="gqa/last")
        self.seqlens = g.op("Cast", [last], name="gqa/seqlens_k", to=TensorProto.INT32)
        total = g.op("Shape", [ATTENTION_MASK], name="gqa/total", start=1, end=2)
        total = g.op("Squeeze", [total, g.const([0])], name="gqa/total0")
        self.total = g.op("Cast", [total], name="gqa/total_len", to=TensorProto.INT32)

    def rope(self, rope: Rope) -> tuple[str, str]:
        key = rope.key()
        if key in self._rope:
            return self._rope[key]
        g, tag = self.g, f"rope{len(self._rope)}"
        rows = self.spec.max_context
        cos, sin = _tables(rope, rope.inv_freq, rows)
        cos_name, sin_name = g.init(f"{tag}.cos", cos), g.init(f"{tag}.sin", sin)
        if rope.long_inv_freq is not None:
            long_cos, long_sin = _tables(rope, rope.long_inv_freq, rows)
            longest = g.op("ReduceMax", [self.seqlens], name=f"{tag}/longest", keepdims=0)
            use_long = g.op(
                "GreaterOrEqual",
                [longest, g.const(rope.long_from, np.int32)],
                name=f"{tag}/long",
            )
            cos_name = g.op(
                "Where", [use_long, g.init(f"{tag}.long_cos", long_cos), cos_name], name=f"{tag}/c"
            )
            sin_name = g.op(
                "Where", [use_long, g.init(f"{tag}.long_sin", long_sin), sin_name], name=f"{tag}/s"
            )
        self._rope[key] = (cos_name, sin_name)
        return self._rope[key]

    def attention(self, g, spec: Spec, x: str, w: dict, i: int) -> str:
        p = f"model.layers.{i}.self_attn"
        nh, kvh, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
        sizes = (nh * d, kvh * d, kvh * d)
        qkv = qkv_projection(g, x, p, w, sizes)
        if spec.qk_norm:
            q, k, v = g.op(
                "Split", [qkv, g.const(list(sizes))], name=f"{p}/split", axis=-1, outputs=3
            )
            q, k = head_norms(g, spec, q, k, w, p)
            qkv_inputs = [q, k, v]
        else:
            qkv_inputs = [qkv, "", ""]
        attrs = {"num_heads": nh, "kv_num_heads": kvh, "scale": float(spec.scale)}
        cos = sin = ""
        if spec.positions == "rope":
            cos, sin = self.rope(spec.rope[i])
            attrs["do_rotary"] = 1
        if spec.attn_softcap:
            attrs["softcap"] = float(spec.attn_softcap)
        if spec.sliding and spec.sliding[i]:
            # keys before the query it may see: transformers' window counts the query itself
            attrs["local_window_size"] = int(spec.sliding_window)
        past_k, past_v = past_names(i)
        present_k, present_v = present_names(i)
        out = f"{p}/gqa/out"
        g.nodes.append(
            helper.make_node(
                "GroupQueryAttention",
                [*qkv_inputs, past_k, past_v, self.seqlens, self.total, cos, sin],
                [out, present_k, present_v],
                name=f"{p}/gqa",
                domain=MS,
                **attrs,
            )
        )
        return linear(g, out, f"{p}.o_proj", w["o"], w.get("o_bias"))
