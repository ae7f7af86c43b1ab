"""A tiny BERT-style encoder with fixed random weights, exported at an old opset.

Exported at opset 12 (before LayerNormalization joined the standard in 17 and Gelu in 20), the
exporter writes LayerNorm as ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add and the exact GELU
as Div/Erf/Add/Mul/Mul: the primitive patterns that graph optimizers must recognise in transformer
models exported a few years ago. The weights are random (BERT's N(0, 0.02) initialisation, fixed
seed): nothing here needs a trained language model, only realistic structure and value ranges.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

VOCAB = 1000
HIDDEN = 128
LAYERS = 2
HEADS = 4
INTERMEDIATE = 512
MAX_POSITIONS = 128
TYPE_VOCAB = 2
SEED = 0


class _Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.query = nn.Linear(HIDDEN, HIDDEN)
        self.key = nn.Linear(HIDDEN, HIDDEN)
        self.value = nn.Linear(HIDDEN, HIDDEN)
        self.attn_out = nn.Linear(HIDDEN, HIDDEN)
        self.attn_norm = nn.LayerNorm(HIDDEN, eps=1e-12)
        self.intermediate = nn.Linear(HIDDEN, INTERMEDIATE)
        self.gelu = nn.GELU()
        self.output = nn.Linear(INTERMEDIATE, HIDDEN)
        self.out_norm = nn.LayerNorm(HIDDEN, eps=1e-12)

    def _heads(self, x):
        b, s, _ = x.shape
        return x.view(b, s, HEADS, HIDDEN // HEADS).transpose(1, 2)

    def forward(self, h, mask_bias):
        q, k, v = self._heads(self.query(h)), self._heads(self.key(h)), self._heads(self.value(h))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(HIDDEN // HEADS) + mask_bias
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
        b, _, s, _ = ctx.shape
        ctx = ctx.transpose(1, 2).reshape(b, s, HIDDEN)
        h = self.attn_norm(h + self.attn_out(ctx))
        return self.out_norm(h + self.output(self.gelu(self.intermediate(h))))


class TinyBert(nn.Module):
    """Embeddings (token, position, type) + LayerNorm, ``LAYERS`` encoder layers, a tanh pooler."""

    def __init__(self):
        super().__init__()
        self.word = nn.Embedding(VOCAB, HIDDEN)
        self.position = nn.Embedding(MAX_POSITIONS, HIDDEN)
        self.token_type = nn.Embedding(TYPE_VOCAB, HIDDEN)
        self.emb_norm = nn.LayerNorm(HIDDEN, eps=1e-12)
        self.layers = nn.ModuleList(_Layer() for _ in range(LAYERS))
        self.pooler = nn.Linear(HIDDEN, HIDDEN)
        self.register_buffer("position_ids", torch.arange(MAX_POSITIONS)[None], persistent=False)

    def forward(self, input_ids, attention_mask, token_type_ids):
        seq = input_ids.shape[1]
        h = self.word(input_ids) + self.position(self.position_ids[:, :seq])
        h = self.emb_norm(h + self.token_type(token_type_ids))
        # Padding positions get a large negative bias before the softmax, as BERT does.
        mask_bias = (1.0 - attention_mask[:, None, None, :].to(h.dtype)) * -10000.0
        for layer in self.layers:
            h = layer(h, mask_bias)
        return h, torch.tanh(self.pooler(h[:, 0]))


def build_module() -> TinyBert:
    gen = torch.Generator().manual_seed(SEED)
    model = TinyBert()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                # Non-trivial LayerNorm scales and shifts, so a fusion that drops them shows up.
                p.copy_(
                    (1.0 if name.endswith("weight") else 0.0)
                    + 0.1 * torch.randn(p.shape, generator=gen)
                )
            else:
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))
    return model.eval()


def sample_inputs(batch: int, seq: int, *, seed: int = 0) -> dict[str, np.ndarray]:
    """Token ids in range, a padded tail in the attention mask, two segments of token types."""
    rng = np.random.default_rng(seed)
    input_ids = rng.integers(1, VOCAB, size=(batch, seq), dtype=np.int64)
    input_ids[:, 0] = 101 % VOCAB  # a fixed "CLS" token, as tokenizers put first
    attention_mask = np.ones((batch, seq), dtype=np.int64)
    token_type_ids = np.zeros((batch, seq), dtype=np.int64)
    for b in range(batch):
        length = int(rng.integers(max(1, seq // 2), seq + 1))
        attention_mask[b, length:] = 0
        input_ids[b, length:] = 0
        token_type_ids[b, length // 2 : length] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": token_type_ids,
    }
