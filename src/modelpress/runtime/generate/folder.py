"""An LLM folder opened for generation: its decoder in ONNX Runtime, tokenizer and chat template.

``open_llm(folder, threads=...)`` reads the folder that ``ir.llm`` describes and returns an
``LLM``: ``config`` (``DecoderConfig``), ``decoder`` (one step of the model, ``decoder.py``),
``tokenizer`` (a ``tokenizers.Tokenizer`` from ``tokenizer.json``) and ``chat_template`` (None
when the checkpoint had none). ``prompt_ids`` turns a prompt or chat messages into token ids the
way transformers does: a plain prompt with the tokenizer's special tokens (``tokenizer(text)``),
a rendered chat without them (``apply_chat_template(..., tokenize=True)``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from modelpress.errors import InputError, ModelLoadError, OptionError, require
from modelpress.ir.llm import (
    MODEL_FILE,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    DecoderConfig,
    read_config,
)
from modelpress.runtime.generate.chat import ChatTemplate, read_chat_template
from modelpress.runtime.generate.decoder import OrtDecoder
from modelpress.runtime.generate.kernels import rows_agree


@dataclass
class LLM:
    folder: Path
    config: DecoderConfig
    decoder: OrtDecoder
    tokenizer: object  # tokenizers.Tokenizer
    tokenizer_config: dict
    chat_template: ChatTemplate | None
    _rows_agree: bool | None = field(default=None, repr=False)  # ``batch_variance``, once

    def prompt_ids(
        self,
        prompt: str | None = None,
        *,
        messages: list[dict] | None = None,
        chat_template: bool = True,
    ) -> list[int]:
        """Token ids of ``prompt`` (a plain text) or of ``messages`` (through the chat template;
        without one, or with ``chat_template=False``, the messages' contents joined by newlines)."""
        if (prompt is None) == (messages is None):
            raise InputError("give either `prompt` or `messages`")
        if prompt is not None:
            if not isinstance(prompt, str) or not prompt:
                raise InputError("`prompt` must be a non-empty string")
            return self.encode(prompt, special=True)
        if chat_template and self.chat_template is not None:
            text = self.chat_template.render(messages, add_generation_prompt=True)
            return self.encode(text, special=False)
        from modelpress.runtime.generate.chat import check_messages

        check_messages(messages)
        text = "\n".join(str(m.get("content") or "") for m in messages)
        return self.encode(text, special=True)

    @property
    def batch_invariant(self) -> bool:
        """Whether a row's logits are the same bits batched as alone (``batch_variance``)."""
        return self.batch_variance() is None

    def batch_variance(self) -> str | None:
        """Why a batched greedy answer can differ from the same request alone, or None.

        Float weights keep a difference in the last bits; int4 ``MatMulNBits`` (activations
        quantized per block) can turn one into another code, so they are invariant only (1) over
        a left-aligned cache, where a row's entries sit at its own columns whatever the batch
        (not under the ``append`` layout of folders written before ``in_place``, where they sit
        behind the batch's hole columns and attention sums round differently) and (2) where this
        CPU's int4 kernel computes a lone row as it computes rows together
        (``kernels.rows_agree``: the model itself, one-token steps of rows alone and together)."""
        q = self.config.quantization
        if q.get("format") != "MatMulNBits":
            return None
        if self.config.kv_layout == "append":
            return (
                "int4 weights over a cache appended by an earlier modelpress (convert the "
                "checkpoint again for answers that do not depend on the batch)"
            )
        if self._rows_agree is None:
            self._rows_agree = rows_agree(self.decoder, self.config)
        if self._rows_agree:
            return None
        return (
            "this CPU's int4 kernel (ONNX Runtime's MatMulNBits) computes a lone row otherwise "
            "than rows in a batch (--max-seqs 1 keeps every answer its solo one)"
        )

    def encode(self, text: str, *, special: bool = True) -> list[int]:
        ids = list(self.tokenizer.encode(text, add_special_tokens=special).ids)
        bos = self.config.bos_token_id
        if special and self.config.add_bos_token and bos is not None and ids[:1] != [bos]:
            ids.insert(0, bos)
        if not ids:
            raise InputError("the prompt has no tokens")
        return ids

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def open_llm(
    folder: str | os.PathLike,
    *,
    threads: int | None = None,
    binding: bool = True,
    spinning: bool | None = None,
    share: bool = True,
) -> LLM:
    """Open the LLM folder ``folder`` for generation (``threads``: ONNX Runtime's intra-op
    threads, default all cores; ``binding``: IO binding for the steps; ``spinning``: let idle
    worker threads spin between steps, ONNX Runtime's default when None; ``share``: a
    ``left_aligned`` decoder's steps write the cache in place, ``decoder.py``)."""
    from modelpress.runtime.ort import session, session_options

    Tokenizer = require("tokenizers", extra="llm", purpose="generating text").Tokenizer

    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise OptionError(f"`threads` must be an integer of at least 1, got {threads!r}")
    p = Path(folder)
    config = read_config(p)
    try:
        tokenizer = Tokenizer.from_file(str(p / TOKENIZER_FILE))
    except Exception as exc:  # the tokenizers package raises its own exception type
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        raise ModelLoadError(f"{p / TOKENIZER_FILE}: not a valid tokenizer ({first})") from None
    tokenizer_config = {}
    tc_path = p / TOKENIZER_CONFIG_FILE
    if tc_path.is_file():
        try:
            tokenizer_config = json.loads(tc_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelLoadError(f"{tc_path}: not valid JSON ({exc})") from None
        if not isinstance(tokenizer_config, dict):
            raise ModelLoadError(f"{tc_path}: expected a JSON object")
    for name, token_id in (("bos_token", config.bos_token_id), ("eos_token", _first(config))):
        if name not in tokenizer_config and token_id is not None:
            text = tokenizer.id_to_token(token_id)
            if text is not None:
                tokenizer_config = {**tokenizer_config, name: text}
    chat_template = read_chat_template(p, tokenizer_config)
    options = session_options(intra_op_threads=threads, inter_op_threads=1)
    if spinning is not None:
        options.add_session_config_entry(
            "session.intra_op.allow_spinning", "1" if spinning else "0"
        )
    decoder = OrtDecoder(
        session(p / MODEL_FILE, options=options), config, binding=binding, share=share
    )
    return LLM(p, config, decoder, tokenizer, tokenizer_config, chat_template)


def _first(config: DecoderConfig) -> int | None:
    return config.eos_token_ids[0] if config.eos_token_ids else None
