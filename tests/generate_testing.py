"""Helpers for the generation tests: a tiny tokenizer and LLM folder, and a transformers decoder
that follows the ``ir.llm`` step contract (the reference the ONNX decoders are held to)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXT = (
    "The quick brown fox jumps over the lazy dog. Grüße aus Köln: 東京 and ünïcödé, émoji 🙂🚀. "
    "Models run on hardware; a decoder writes one token at a time, and a cache keeps the past. "
    "Once upon a time there was a little model that wanted to run fast on every CPU. "
)


def tiny_tokenizer(vocab_size: int = 320):
    """A byte-level BPE tokenizer trained here on a few sentences (ids 0-2: the special tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT] * 4, trainer=trainer)
    return tok


def tiny_llama(vocab_size: int, *, seed: int = 0, layers: int = 2, kv_heads: int = 2):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=256,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger logits than the default init: fewer near-ties
        for p in model.parameters():
            p.mul_(4.0 if p.dim() == 2 else 1.0)
    return model


class TorchDecoder:
    """transformers' model driven through the decoder contract (kv_layout "append")."""

    def __init__(self, model) -> None:
        self.model = model
        self.calls: list[tuple[int, int]] = []  # (rows, new tokens) of each call

    def __call__(self, input_ids, attention_mask, position_ids, keys, values):
        import torch
        from transformers import DynamicCache

        self.calls.append(input_ids.shape)
        cache = DynamicCache()
        if keys and keys[0].shape[2] > 0:
            for i, (k, v) in enumerate(zip(keys, values)):
                cache.update(torch.from_numpy(np.array(k)), torch.from_numpy(np.array(v)), i)
        with torch.no_grad():
            out = self.model(
                input_ids=torch.from_numpy(input_ids),
                attention_mask=torch.from_numpy(attention_mask),
                position_ids=torch.from_numpy(position_ids),
                past_key_values=cache,
                use_cache=True,
            )
        pkv = out.past_key_values
        ks = [layer.keys.numpy() for layer in pkv.layers]
        vs = [layer.values.numpy() for layer in pkv.layers]
        return out.logits[:, -1, :].float().numpy(), ks, vs


def decoder_config(model, **overrides):
    from modelpress.ir.llm import DecoderConfig

    c = model.config
    fields = dict(
        family="llama",
        num_layers=c.num_hidden_layers,
        num_kv_heads=c.num_key_value_heads,
        head_dim=c.hidden_size // c.num_attention_heads,
        vocab_size=c.vocab_size,
        max_context=c.max_position_embeddings,
        eos_token_ids=(2,),
    )
    return DecoderConfig(**{**fields, **overrides})


class FakeLLM:
    """What the scheduler needs of an ``LLM``: a decoder, its config, a tokenizer, prompt ids."""

    def __init__(self, decoder, config, tokenizer, chat_template=None) -> None:
        self.decoder, self.config, self.tokenizer = decoder, config, tokenizer
        self.chat_template = chat_template
        self.folder = Path(".")

    def prompt_ids(self, prompt=None, *, messages=None, chat_template=True):
        from modelpress.runtime.generate.folder import LLM

        return LLM.prompt_ids(self, prompt, messages=messages, chat_template=chat_template)

    def encode(self, text, *, special=True):
        from modelpress.runtime.generate.folder import LLM

        return LLM.encode(self, text, special=special)


def write_tokenizer_files(folder: Path, tokenizer, *, template: str | None = CHATML) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 256,
    }
    if template is not None:
        config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


class LeftAlignedTorchDecoder(TorchDecoder):
    """The same model through the "left_aligned" contract: row ``b``'s ``n_b`` real entries come
    first and a step writes its new one at ``n_b`` (``n_b``: the ones in its mask before it)."""

    def __call__(self, input_ids, attention_mask, position_ids, keys, values):
        past = keys[0].shape[2] if keys else 0
        new = input_ids.shape[1]
        if past == 0 or attention_mask.all():  # no row shorter: appending is writing at n_b
            return super().__call__(input_ids, attention_mask, position_ids, keys, values)
        assert new == 1
        n = attention_mask.sum(axis=1) - new
        ones_then_zeros = np.arange(past + new)[None, :] < (n + new)[:, None]
        assert (attention_mask.astype(bool) == ones_then_zeros).all(), "not ones then zeros"
        # transformers appends at column `past`; the contract wants it at n_b
        mask = np.concatenate([attention_mask[:, :past], np.ones((len(n), 1), np.int64)], axis=1)
        mask[:, :past] = np.arange(past)[None, :] < n[:, None]
        logits, ks, vs = super().__call__(input_ids, mask, position_ids, keys, values)
        rows = np.arange(len(n))

        def move(a):
            a = a.copy()
            a[rows, :, n] = a[rows, :, past]
            a[rows[n < past], :, past] = 0
            return a

        return logits, [move(k) for k in ks], [move(v) for v in vs]
