"""A small TRAINED decoder as a Hugging Face Llama folder: glassllm's English model.

The ``glassllm`` package ships a 4-layer decoder (hidden 128, 4 query and 2 key/value heads,
SwiGLU 341, RMSNorm, RoPE, tied embeddings, a 1,024-token BPE, context 128) trained in float on
English text, with float16 weights: the one trained model in the registries whose weights sit on
no 4-bit grid, small enough for a test. Its architecture is Llama's, up to two conventions,
which ``glass_checkpoint`` maps exactly:

- RoPE turns adjacent pairs ``(2i, 2i+1)`` of each head; Llama turns ``(i, i + d/2)``. Permuting
  each head's query and key columns (evens, then odds) changes no dot product ``q·k``.
- Its tokenizer (NFC, spaces as ``▁``, chunks by one regular expression, rank-ordered merges) is
  written as a ``tokenizers`` BPE with the same normalizer, split and merges.

Nothing is downloaded: the weights are package data.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from modelpress.errors import require

CHUNKS = r"\n|▁*[^▁\n]+|▁+"  # glassllm.tokenizer's chunk pattern
SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>")


def _halves(columns: np.ndarray, heads: int) -> np.ndarray:
    """Columns ``[in, heads·d]`` with each head's dims reordered evens first, then odds."""
    k, n = columns.shape
    d = n // heads
    order = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])
    return columns.reshape(k, heads, d)[:, :, order].reshape(k, n)


def _tokenizer(path: Path):
    tokenizers = require("tokenizers", extra="llm", purpose="glassllm's tokenizer")
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers

    data = json.loads(path.read_text(encoding="utf-8"))
    merges = [tuple(pair) for pair in data["merges"]]
    vocab: dict[str, int] = {}
    for i, token in enumerate([*SPECIALS, *data["alphabet"], *(a + b for a, b in merges)]):
        vocab[token] = i  # a repeated string keeps its last id, as glassllm's table does
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(CHUNKS), behavior="isolated")
    tok.decoder = decoders.Replace("▁", " ")
    return tok


def glass_checkpoint(path: str | os.PathLike, lang: str = "en") -> Path:
    """Write glassllm's ``lang`` model at ``path`` as a Hugging Face Llama folder; return it."""
    glassllm = require("glassllm", extra="test", purpose="a small trained decoder")
    transformers = require("transformers", extra="llm", purpose="a Llama folder")
    torch = require("torch", extra="torch", purpose="a Llama folder")
    from importlib import resources

    base = resources.files("glassllm") / "weights"
    model, _ = glassllm.load_pretrained(lang)
    cfg = model.cfg
    w = {name: p.data.astype(np.float32) for name, p in model.named_parameters().items()}
    config = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=w["blocks.0.ffn.W1"].shape[1],
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        max_position_embeddings=cfg.max_len,
        rope_theta=cfg.rope_base,
        rms_norm_eps=cfg.eps,
        tie_word_embeddings=True,
        bos_token_id=SPECIALS.index("<bos>"),
        eos_token_id=SPECIALS.index("<eos>"),
        pad_token_id=SPECIALS.index("<pad>"),
    )
    hf = transformers.LlamaForCausalLM(config)
    state = {"model.embed_tokens.weight": w["E"], "model.norm.weight": w["norm_f.gamma"]}
    for i in range(cfg.n_layers):
        b, p = f"blocks.{i}.", f"model.layers.{i}."
        state[p + "input_layernorm.weight"] = w[b + "norm1.gamma"]
        state[p + "post_attention_layernorm.weight"] = w[b + "norm2.gamma"]
        state[p + "self_attn.q_proj.weight"] = _halves(w[b + "attn.W_Q"], cfg.n_heads).T
        state[p + "self_attn.k_proj.weight"] = _halves(w[b + "attn.W_K"], cfg.n_kv_heads).T
        state[p + "self_attn.v_proj.weight"] = w[b + "attn.W_V"].T
        state[p + "self_attn.o_proj.weight"] = w[b + "attn.W_O"].T
        state[p + "mlp.gate_proj.weight"] = w[b + "ffn.W1"].T
        state[p + "mlp.up_proj.weight"] = w[b + "ffn.W3"].T
        state[p + "mlp.down_proj.weight"] = w[b + "ffn.W2"].T
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}
    hf.load_state_dict(tensors, strict=False)  # lm_head: tied to the embeddings
    hf.tie_weights()
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    hf.generation_config.do_sample = False
    hf.save_pretrained(out)
    with resources.as_file(base / f"{lang}.tokenizer.json") as vocab:
        tok = transformers.PreTrainedTokenizerFast(
            tokenizer_object=_tokenizer(Path(vocab)),
            bos_token="<bos>",
            eos_token="<eos>",
            pad_token="<pad>",
            unk_token="<unk>",
        )
    tok.save_pretrained(out)
    return out
