"""Tiny decoder checkpoints with fixed random weights, one per family modelpress converts.

``tiny_checkpoint(path, family="llama", seed=0)`` writes a Hugging Face folder (``config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json`` with a chat template,
``generation_config.json``) that ``modelpress convert`` reads like a real one. The model is built
with transformers ``from_config``; its weights are then drawn again at a scale that makes the
logits spread over several units (transformers' own init leaves them within hundredths of each
other, where greedy decoding would compare ties). The tokenizer is a byte-level BPE trained on a
few sentences (a few hundred tokens), the same for every family. Nothing is downloaded.

Families: ``llama`` (also ``llama-tied``, ``llama3-rope``), ``qwen2``, ``mistral``, ``gemma``,
``gemma2``, ``gemma3``, ``phi3`` (also ``phi3-longrope``), ``gpt2``, ``gpt_neox``. Gemma's tiny models have an 8-token sliding window, so the window matters within a
short test.
"""

from __future__ import annotations

import os
from pathlib import Path

from modelpress.errors import OptionError, require

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time there was a small model that ran on every CPU.",
    "ONNX Runtime runs the decoder one token at a time, with its cache.",
    "A language model predicts the next word from the words before it.",
    "Hello world! How are you today? I am fine, thank you.",
    "Quantization trades a little accuracy for speed and memory.",
]
VOCAB = 320

_SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    vocab_size=VOCAB,
    bos_token_id=0,
    eos_token_id=0,
    pad_token_id=0,
)

# family -> (transformers config class name, config arguments)
CONFIGS: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", {**_SMALL, "tie_word_embeddings": False}),
    "llama-tied": ("LlamaConfig", {**_SMALL, "tie_word_embeddings": True}),
    "llama3-rope": (
        "LlamaConfig",
        {
            **_SMALL,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "qwen2": ("Qwen2Config", {**_SMALL, "tie_word_embeddings": True}),
    "mistral": ("MistralConfig", {**_SMALL, "sliding_window": None}),
    "gemma2": (
        "Gemma2Config",
        {
            **_SMALL,
            "head_dim": 16,
            "query_pre_attn_scalar": 24,
            "sliding_window": 8,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
        },
    ),
    "gemma3": (
        "Gemma3TextConfig",
        {
            **_SMALL,
            "num_hidden_layers": 3,
            "head_dim": 16,
            "query_pre_attn_scalar": 24,
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        },
    ),
    "phi3": ("Phi3Config", {**_SMALL, "pad_token_id": 0}),
    # Phi-3's long-context rope: positions from 32 on use the long factors
    "phi3-longrope": (
        "Phi3Config",
        {
            **_SMALL,
            "pad_token_id": 0,
            "original_max_position_embeddings": 32,
            "rope_scaling": {
                "rope_type": "longrope",
                "short_factor": [1.0 + 0.1 * k for k in range(8)],
                "long_factor": [1.5 + 0.5 * k for k in range(8)],
                "original_max_position_embeddings": 32,
            },
        },
    ),
    "gemma": ("GemmaConfig", {**_SMALL, "head_dim": 16}),
    "gpt2": (
        "GPT2Config",
        {
            "n_embd": 64,
            "n_layer": 2,
            "n_head": 4,
            "n_positions": 256,
            "vocab_size": VOCAB,
            "bos_token_id": 0,
            "eos_token_id": 0,
        },
    ),
    "gpt_neox": (
        "GPTNeoXConfig",
        {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "max_position_embeddings": 256,
            "vocab_size": VOCAB,
            "rotary_pct": 0.25,
            "use_parallel_residual": True,
            "bos_token_id": 0,
            "eos_token_id": 0,
            "tie_word_embeddings": False,
        },
    ),
}
FAMILIES = tuple(CONFIGS)


def tiny_tokenizer():
    """A byte-level BPE tokenizer of ``VOCAB`` tokens trained on ``CORPUS`` (deterministic)."""
    tokenizers = require("tokenizers", extra="llm", purpose="the tiny decoder's tokenizer")
    transformers = require("transformers", extra="llm", purpose="the tiny decoder's tokenizer")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIAL[0],
        eos_token=SPECIAL[0],
        pad_token=SPECIAL[0],
        unk_token=None,
        chat_template=CHAT_TEMPLATE,
    )


def tiny_model(family: str = "llama", *, seed: int = 0):
    """The transformers model of a tiny ``family`` decoder with fixed random weights."""
    if family not in CONFIGS:
        raise OptionError(f"`family` {family!r}: expected one of {', '.join(FAMILIES)}")
    transformers = require("transformers", extra="llm", purpose="a tiny decoder")
    torch = require("torch", extra="torch", purpose="a tiny decoder")
    cls_name, kwargs = CONFIGS[family]
    config = getattr(transformers, cls_name)(**kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                fan_in = p.shape[0] if "c_" in name.split(".")[-2] else p.shape[-1]  # GPT-2 Conv1D
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in**0.5)
            elif "norm" in name or name.split(".")[-2].startswith(("ln", "layer_norm")):
                base = 0.0 if family.startswith("gemma") and name.endswith("weight") else 1.0
                if name.endswith("bias"):
                    base = 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    if model.config.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


def tiny_checkpoint(path: str | os.PathLike, family: str = "llama", *, seed: int = 0) -> Path:
    """Write a tiny ``family`` checkpoint folder at ``path`` (created) and return it."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model = tiny_model(family, seed=seed)
    model.generation_config.do_sample = False
    model.save_pretrained(out)
    tiny_tokenizer().save_pretrained(out)
    return out
