"""The transformer ops of opset 23: RotaryEmbedding and Attention (what the LLM exporter writes).

Semantics as the ONNX reference implementation (``onnx/reference/ops/op_attention.py``,
``op_rotary_embedding.py``): 3-D inputs are ``[batch, seq, heads*head]`` (the head counts come
from the attributes), 4-D ones ``[batch, heads, seq, head]``; the KV cache is ``past`` concatenated
with the new keys and values along the sequence; ``is_causal`` is aligned bottom-right (a query
``i`` sees key ``j`` iff ``j <= i + past``); a boolean mask is True where a key is visible, a float
one is added to the scores; a mask shorter than the keys is padded as masked; grouped-query heads
repeat each KV head ``q_heads / kv_heads`` times; a query row that sees no key outputs zeros.
"""

from __future__ import annotations

import math

import torch

from modelpress.runtime.torch_backend.errors import UnsupportedOpError
from modelpress.runtime.torch_backend.registry import op


def _heads(x: torch.Tensor, count: int) -> torch.Tensor:
    """``[b, s, h*d]`` → ``[b, h, s, d]``."""
    b, s, hd = x.shape
    return x.reshape(b, s, count, hd // count).transpose(1, 2)


@op("RotaryEmbedding", since=23)
def rotary_embedding(ctx, x, cos, sin, position_ids=None):
    interleaved = bool(ctx.attr("interleaved", 0))
    three_d = x.dim() == 3
    h = _heads(x, ctx.attr("num_heads", 0)) if three_d else x  # [b, h, s, d]
    if position_ids is not None:
        cos, sin = cos[position_ids.to(torch.int64)], sin[position_ids.to(torch.int64)]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [b, 1, s, r/2]
    r = ctx.attr("rotary_embedding_dim", 0) or h.shape[-1]
    rot, rest = h[..., :r], h[..., r:]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot[..., : r // 2], rot[..., r // 2 :]
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    rot = torch.stack([real, imag], -1).flatten(-2) if interleaved else torch.cat([real, imag], -1)
    out = torch.cat([rot, rest], -1)
    return out.transpose(1, 2).reshape(x.shape) if three_d else out


@op("Attention", since=23)
def attention(ctx, q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad=None):
    if nonpad is not None or ctx.attr("left_window_size", -1) >= 0:
        raise UnsupportedOpError(f"node {ctx.name!r}: Attention with a sliding window or nonpad")
    if len(ctx.outputs_used) > 3 and ctx.outputs_used[3]:
        raise UnsupportedOpError(f"node {ctx.name!r}: Attention's qk_matmul_output")
    three_d = q.dim() == 3
    if three_d:
        q = _heads(q, ctx.attr("q_num_heads"))
        k = _heads(k, ctx.attr("kv_num_heads"))
        v = _heads(v, ctx.attr("kv_num_heads"))
    past = 0 if past_key is None else past_key.shape[2]
    if past_key is not None:
        k, v = torch.cat([past_key, k], 2), torch.cat([past_value, v], 2)
    present_k, present_v = k, v
    s_q, s_k = q.shape[2], k.shape[2]
    bias = torch.zeros((s_q, s_k), dtype=q.dtype, device=q.device)
    if attn_mask is not None:
        pad = s_k - attn_mask.shape[-1]
        if attn_mask.dtype == torch.bool:
            if pad > 0:
                attn_mask = torch.nn.functional.pad(attn_mask, (0, pad), value=False)
            attn_mask = torch.zeros_like(attn_mask, dtype=q.dtype).masked_fill(
                ~attn_mask, -math.inf
            )
        elif pad > 0:
            attn_mask = torch.nn.functional.pad(attn_mask, (0, pad), value=-math.inf)
        bias = bias + attn_mask
    if ctx.attr("is_causal", 0):
        i = torch.arange(s_q, device=q.device)[:, None]
        j = torch.arange(s_k, device=q.device)[None, :]
        bias = bias.masked_fill(j > i + past, -math.inf)
    if q.shape[1] != k.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scale = ctx.attr("scale") or 1.0 / math.sqrt(q.shape[-1])
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    softcap = ctx.attr("softcap", 0.0)
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores + bias
    dead = torch.isneginf(bias.amax(-1, keepdim=True))
    probs = torch.softmax(scores, -1).masked_fill(dead, 0.0)
    y = torch.matmul(probs, v)
    if three_d:
        y = y.transpose(1, 2).reshape(y.shape[0], s_q, -1)
    return y, present_k, present_v
