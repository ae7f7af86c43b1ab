"""The transformer ops of opset 23: RotaryEmbedding and Attention (what the LLM exporter writes).

Semantics as the ONNX reference implementation (``onnx/reference/ops/op_attention.py``,
``op_rotary_embedding.py``): 3-D inputs are ``[batch, seq, heads*head]`` (the head counts come
from the attributes), 4-D ones ``[batch, heads, seq, head]``; the KV cache is ``past`` concatenated
with the new keys and values along the sequence; ``is_causal`` is aligned bottom-right (a query
``i`` sees key ``j`` iff ``j <= i + past``); a boolean mask is True where a key is visible, a float
one is added to the scores; a mask shorter than the keys is padded as masked; ``nonpad_kv_seqlen``
(an external cache) masks each batch's keys past its length and moves its causal frontier; the
sliding window (opset 24's ``left_window_size``/``right_window_size``) bounds ``i + offset - j``;
grouped-query heads repeat each KV head ``q_heads / kv_heads`` times; a query row that sees no key
outputs zeros; ``qk_matmul_output`` follows ``qk_matmul_output_mode``. Scores and softmax are
computed in float32 whatever the input type (the reference computes bfloat16 inputs in bfloat16:
those node tests differ by more than their tolerance).
"""

from __future__ import annotations

import math

import torch

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


def _bias(ctx, q, s_k, attn_mask, past: int, nonpad):
    """The additive bias (0 or -inf, plus a float mask) of the scores ``[..., s_q, s_k]``."""
    s_q, dev = q.shape[2], q.device
    bias = torch.zeros((s_q, s_k), dtype=torch.float32, device=dev)
    if attn_mask is not None:
        pad = s_k - attn_mask.shape[-1]
        if attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros(attn_mask.shape, device=dev).masked_fill(~attn_mask, -math.inf)
        attn_mask = attn_mask.to(torch.float32)
        if pad > 0:
            attn_mask = torch.nn.functional.pad(attn_mask, (0, pad), value=-math.inf)
        bias = bias + attn_mask
    # the query block starts at `offset`: after the past, or (external cache) its valid keys
    offset = torch.tensor(past, device=dev)
    if nonpad is not None and past == 0:
        offset = (nonpad.to(torch.int64) - s_q).reshape(-1, 1, 1, 1)
    diff = torch.arange(s_q, device=dev)[:, None] + offset - torch.arange(s_k, device=dev)
    blocked = torch.zeros(diff.shape, dtype=torch.bool, device=dev)
    if ctx.attr("is_causal", 0):
        blocked |= diff < 0
    left, right = ctx.attr("left_window_size", -1), ctx.attr("right_window_size", -1)
    if left >= 0:
        blocked |= diff > left
    if right >= 0:
        blocked |= -diff > right
    bias = bias + torch.zeros(blocked.shape, device=dev).masked_fill(blocked, -math.inf)
    if nonpad is not None:
        valid = torch.arange(s_k, device=dev) < nonpad.to(torch.int64).reshape(-1, 1, 1, 1)
        bias = bias + torch.zeros(valid.shape, device=dev).masked_fill(~valid, -math.inf)
    return bias


@op("Attention", since=23)
def attention(ctx, q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad=None):
    three_d, dtype = q.dim() == 3, q.dtype
    if three_d:
        q = _heads(q, ctx.attr("q_num_heads"))
        k = _heads(k, ctx.attr("kv_num_heads"))
        v = _heads(v, ctx.attr("kv_num_heads"))
    past = 0 if past_key is None else past_key.shape[2]
    if past_key is not None:
        k, v = torch.cat([past_key, k], 2), torch.cat([past_value, v], 2)
    present_k, present_v = k, v
    bias = _bias(ctx, q, k.shape[2], attn_mask, past, nonpad)
    if q.shape[1] != k.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    q, k, v = q.to(torch.float32), k.to(torch.float32), v.to(torch.float32)
    scale = ctx.attr("scale") or 1.0 / math.sqrt(q.shape[-1])
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    softcap = ctx.attr("softcap", 0.0)
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    biased = scores + bias
    dead = torch.isneginf(bias.amax(-1, keepdim=True))
    probs = torch.softmax(biased, -1).masked_fill(dead, 0.0)
    y = torch.matmul(probs, v).to(dtype)
    if three_d:
        y = y.transpose(1, 2).reshape(y.shape[0], y.shape[2], -1)
    mode = ctx.attr("qk_matmul_output_mode", 0)
    qk = {2: biased, 3: probs}.get(mode, scores).to(dtype)
    return y, present_k, present_v, qk
