"""The LLM folder: a decoder-only language model as modelpress writes and reads it.

A generative model travels as a folder instead of a file::

    LLM_DIR/
      model.onnx            the decoder (its weights in model.onnx.data when large)
      modelpress_llm.json   how to drive it: ``DecoderConfig`` below
      tokenizer.json        the Hugging Face fast tokenizer, as the checkpoint had it
      tokenizer_config.json its special tokens and chat template (when the checkpoint had one)

The decoder's interface is fixed, whatever the family or the optimization level:

inputs
  ``input_ids``        int64 ``[batch, seq]``
  ``attention_mask``   int64 ``[batch, past + seq]``: 1 for a real token, 0 for a hole
  ``position_ids``     int64 ``[batch, seq]``: each token's position in its own sequence
  ``past_key_values.{i}.key`` / ``.value``  ``[batch, kv_heads, past, head_dim]`` (``kv_dtype``;
                       ``past + seq`` wide for ``in_place``, below)
  ``logits_to_keep``   int64 scalar, optional: an input with a default in the file (an
                       initializer of the same name, so ONNX Runtime lists it among
                       ``get_overridable_initializers``) that keeps every position; a driver that
                       needs only the next token's logits feeds 1, and the LM head then runs on
                       the last position alone (a prompt's prefill: ``seq`` times less head work
                       and logits memory). Folders written before it have no such input.
outputs
  ``logits``           float32 ``[batch, seq, vocab]`` (``[batch, min(seq, logits_to_keep), vocab]``)
  ``present.{i}.key`` / ``.value``  ``[batch, kv_heads, past + seq, head_dim]``

``kv_layout`` says where a step writes its new keys and values:

- ``in_place`` (the standard level): row ``b`` holds its ``n_b`` real entries first, and the past
  is as wide as the mask (``[batch, kv_heads, past + seq, head_dim]``: the step's room comes with
  it, zeros or anything after a row's entries); the step writes its new entries at columns
  ``n_b ..`` of the past, where ``n_b`` is the number of ones in the row's mask less ``seq``
  (at least 0), and the present is that past. A driver may bind present and past to one buffer
  (then only the new entries are written). Masks are ones followed by zeros.
- ``left_aligned`` (ONNX Runtime's GroupQueryAttention): row ``b`` holds its ``n_b`` real entries
  first and the step writes its new ones at ``n_b``, where ``n_b`` is the number of ones in that
  row's mask before the new tokens. Masks must therefore be ones followed by zeros.
- ``append`` (standard-level folders written before ``in_place``): every row's new entries go at
  the end, after ``past``; holes (padding of rows shorter than the batch's longest) may sit
  anywhere and are masked out by ``attention_mask``. Any mask is valid, so rows may be
  left-padded or joined mid-way. A row's entries sit at other columns batched than alone, so
  its logits may differ from its solo ones in the last bits.

A left-aligned row's entries sit at the same columns whatever the batch: with the ``in_place``
and ``left_aligned`` layouts a row's logits are bit for bit those it gets alone.

The first step of a sequence (prefill) passes ``past`` of length 0.
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from modelpress.errors import ModelLoadError

CONFIG_FILE = "modelpress_llm.json"
MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
FORMAT_VERSION = 1

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
LOGITS = "logits"
LOGITS_TO_KEEP = "logits_to_keep"
KEEP_ALL = 2**62  # logits_to_keep's default: more positions than any sequence has
KV_LAYOUTS = ("append", "left_aligned", "in_place")
LEFT_ALIGNED = ("left_aligned", "in_place")  # a row's entries are its first columns


def past_names(layer: int) -> tuple[str, str]:
    """Names of the key and value cache inputs of ``layer``."""
    return f"past_key_values.{layer}.key", f"past_key_values.{layer}.value"


def present_names(layer: int) -> tuple[str, str]:
    """Names of the key and value cache outputs of ``layer``."""
    return f"present.{layer}.key", f"present.{layer}.value"


def past_feed(layout: str, cache, seq: int):
    """What a step of ``seq`` tokens is fed as the past of one cache array ``cache`` (``[batch,
    kv_heads, past, head_dim]``, numpy): ``cache`` itself, or for ``in_place`` ``cache`` with
    ``seq`` zero columns after it (the step's room)."""
    if layout != "in_place":
        return cache
    import numpy as np

    room = np.zeros((*cache.shape[:2], seq, cache.shape[3]), cache.dtype)
    return np.concatenate([cache, room], axis=2)


@dataclass(frozen=True)
class DecoderConfig:
    """What a driver needs to know to run the decoder of an LLM folder."""

    family: str  # the architecture it was built from: llama, qwen2, gemma2, gemma3, phi3, gpt2, ...
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_context: int  # the longest sequence (prompt + generated) the model was trained for
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    kv_dtype: str = "float32"
    kv_layout: str = "append"
    level: str = "standard"  # "standard": ONNX ops only; "ort": ONNX Runtime's contrib ops
    sliding_window: int | None = None  # tokens a local layer attends to (Gemma 2/3), if any
    add_bos_token: bool = False  # whether the tokenizer's template wants BOS before a prompt
    # Phi-3's longrope switches its rope frequencies once a sequence passes this many tokens; the
    # keys cached before were rotated with the other ones, so a driver runs the whole sequence
    # again (one prefill from its start) at the step where its length first exceeds this, as
    # transformers does. None: never.
    prefill_again_after: int | None = None
    source: str = ""  # the checkpoint it was converted from
    quantization: dict = field(default_factory=dict)  # {"mode": "int4", "method": ..., ...}
    format_version: int = FORMAT_VERSION

    def to_dict(self) -> dict:
        d = asdict(self)
        d["eos_token_ids"] = list(self.eos_token_ids)
        return d

    @classmethod
    def from_dict(cls, data: dict, *, where: str = CONFIG_FILE) -> DecoderConfig:
        known = {f.name for f in fields(cls)}
        missing = [
            f.name
            for f in fields(cls)
            if f.name not in data and f.default is MISSING and f.default_factory is MISSING
        ]
        if missing:
            raise ModelLoadError(f"{where}: missing field(s) {', '.join(missing)}")
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["eos_token_ids"] = tuple(int(t) for t in kwargs.get("eos_token_ids", ()))
        try:
            config = cls(**kwargs)
        except TypeError as exc:
            raise ModelLoadError(f"{where}: {exc}") from None
        if config.kv_layout not in KV_LAYOUTS:
            raise ModelLoadError(
                f"{where}: kv_layout {config.kv_layout!r} is not one of {', '.join(KV_LAYOUTS)}"
            )
        for name in ("num_layers", "num_kv_heads", "head_dim", "vocab_size", "max_context"):
            value = getattr(config, name)
            if not isinstance(value, int) or value <= 0:
                raise ModelLoadError(f"{where}: {name} must be a positive integer, got {value!r}")
        return config


def is_llm_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder that holds an LLM (its ``modelpress_llm.json``)."""
    p = Path(path)
    return p.is_dir() and (p / CONFIG_FILE).is_file()


def read_config(folder: str | os.PathLike) -> DecoderConfig:
    """The ``DecoderConfig`` of an LLM folder; ``ModelLoadError`` naming what is wrong."""
    p = Path(folder)
    cfg = p / CONFIG_FILE
    if not p.is_dir():
        raise ModelLoadError(
            f"{p}: not a folder (an LLM is a folder written by `modelpress convert`)"
        )
    if not cfg.is_file():
        raise ModelLoadError(f"{p}: no {CONFIG_FILE} (not an LLM folder written by modelpress)")
    try:
        data = json.loads(cfg.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{cfg}: not valid JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{cfg}: expected a JSON object")
    config = DecoderConfig.from_dict(data, where=str(cfg))
    for name in (MODEL_FILE, TOKENIZER_FILE):
        if not (p / name).is_file():
            raise ModelLoadError(f"{p}: {name} is missing")
    return config
