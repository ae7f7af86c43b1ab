"""Text pre-processing: a string to token ids, attention mask and token types, through a
``tokenizer.json`` read by the ``tokenizers`` library (the file is stored in the model, so the
model carries its tokenizer wherever it goes).

Each text is encoded alone (special tokens added, truncated to ``max_length`` when
``truncation`` is on); a batch is then padded on the right with ``pad_id`` to its longest text
(``padding=longest``) or to ``max_length`` (``padding=max_length``), the mask 1 on real tokens
and 0 on padding, token types 0 on padding. That is what ``Tokenizer.encode_batch`` returns with
the same truncation and padding, so the batch job and the server agree with the training code.

Precondition: the model's token inputs are 2-D (batch, sequence) integer tensors; a fixed
sequence length forces ``padding=max_length`` with that length.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from modelpress.errors import InputError, require
from modelpress.runtime.processing import fields
from modelpress.runtime.processing.fields import convert_fields, fail, read_text_file
from modelpress.runtime.processing.signature import Tensor

KEYS = {
    "tokenizer": lambda field, v: v,  # a path, read by ``declare`` (stored as tokenizer_json)
    "tokenizer_json": fields.as_name,
    "max_length": fields.as_int,
    "padding": fields.as_choice(("longest", "max_length")),
    "truncation": fields.as_bool,
    "pad_id": lambda field, v: fields.as_int(field, v, minimum=0),
    "ids": fields.as_name,
    "mask": fields.as_name,
    "types": fields.as_name,
}
DEFAULT_MAX_LENGTH = 512
ROLES = (("ids", "input_ids"), ("mask", "attention_mask"), ("types", "token_type_ids"))


def _tokenizers():
    return require("tokenizers", extra="pipeline", purpose="text pre-processing")


@dataclass(frozen=True)
class TextPre:
    kind: ClassVar[str] = "text"
    tokenizer_json: str
    max_length: int
    padding: str
    truncation: bool
    pad_id: int
    ids: str
    mask: str | None
    types: str | None
    dtypes: tuple[tuple[str, str], ...]  # (input name, integer dtype) for each input fed

    @classmethod
    def declare(
        cls, raw: dict[str, Any], model_inputs: list[Tensor], *, base: Path | None = None
    ) -> TextPre:
        raw = dict(raw)
        if "tokenizer" in raw:
            if "tokenizer_json" in raw:
                raise fail(
                    "pre.tokenizer",
                    "give tokenizer (a file) or tokenizer_json (its content), not both",
                )
            raw["tokenizer_json"] = read_text_file("pre.tokenizer", raw.pop("tokenizer"), base)
        f = convert_fields(raw, KEYS, where="pre")
        if "tokenizer_json" not in f:
            raise fail("pre.tokenizer", "text pre-processing needs tokenizer=PATH/tokenizer.json")
        config = _tokenizer_config(f["tokenizer_json"])
        by_name = {t.name: t for t in model_inputs}
        roles: dict[str, str | None] = {}
        for role, default in ROLES:
            name = f.get(role)
            if name is not None and name not in by_name:
                raise fail(
                    f"pre.{role}", f"the model has no input {name!r} (inputs: {', '.join(by_name)})"
                )
            if name is None and default in by_name:
                name = default
            roles[role] = name
        if roles["ids"] is None:
            if len(model_inputs) != 1:
                raise fail(
                    "pre.ids", f"name the model's token-id input (inputs: {', '.join(by_name)})"
                )
            roles["ids"] = model_inputs[0].name
        seq = None
        for role, name in roles.items():
            if name is None:
                continue
            t = by_name[name]
            if t.dims is not None and len(t.dims) != 2:
                raise fail(
                    f"pre.{role}", f"token inputs are (batch, sequence), {t.describe()} is not 2-D"
                )
            if t.dtype.kind not in "iu":
                raise fail(f"pre.{role}", f"token inputs are integers, {t.describe()} is not")
            if t.dims is not None and t.dims[1] is not None:
                if seq is not None and seq != t.dims[1]:
                    raise fail(
                        f"pre.{role}",
                        f"{t.describe()} has another sequence length than the other token inputs",
                    )
                seq = t.dims[1]
        max_length = f.get("max_length") or seq or config.get("max_length") or DEFAULT_MAX_LENGTH
        if seq is not None and max_length != seq:
            raise fail(
                "pre.max_length", f"{max_length} given, the model takes sequences of exactly {seq}"
            )
        padding = f.get("padding") or ("max_length" if seq is not None else "longest")
        if seq is not None and padding != "max_length":
            raise fail(
                "pre.padding", f"the model takes sequences of exactly {seq}: use padding=max_length"
            )
        return cls(
            tokenizer_json=f["tokenizer_json"],
            max_length=max_length,
            padding=padding,
            truncation=f.get("truncation", True),
            pad_id=f.get("pad_id", config.get("pad_id", 0)),
            ids=roles["ids"],
            mask=roles["mask"],
            types=roles["types"],
            dtypes=tuple((n, str(by_name[n].dtype)) for n in roles.values() if n is not None),
        )

    def to_dict(self) -> dict[str, Any]:
        d = {
            "kind": self.kind,
            "max_length": self.max_length,
            "padding": self.padding,
            "truncation": self.truncation,
            "pad_id": self.pad_id,
            "ids": self.ids,
            "mask": self.mask,
            "types": self.types,
            "tokenizer_json": self.tokenizer_json,
        }
        return {k: v for k, v in d.items() if v is not None}

    @property
    def input_names(self) -> list[str]:
        return [name for name, _ in self.dtypes]

    @cached_property
    def tokenizer(self):
        tok = _tokenizers().Tokenizer.from_str(self.tokenizer_json)
        tok.no_padding()  # a batch is padded in collate, to its own longest text
        if self.truncation:
            tok.enable_truncation(max_length=self.max_length)
        else:
            tok.no_truncation()
        return tok

    def prepare(self, item: str | bytes, *, label: str = "item") -> dict[str, np.ndarray]:
        if isinstance(item, (bytes, bytearray)):
            try:
                item = bytes(item).decode("utf-8")
            except UnicodeDecodeError:
                raise InputError(f"{label}: text is not valid UTF-8") from None
        if not isinstance(item, str):
            raise InputError(f"{label}: a text model takes a string, got {type(item).__name__}")
        enc = self.tokenizer.encode(item)
        if len(enc.ids) > self.max_length:
            raise InputError(
                f"{label}: {len(enc.ids)} tokens, the model takes at most {self.max_length} "
                "(truncation is off in its declaration)"
            )
        arrays = {"ids": enc.ids, "mask": enc.attention_mask, "types": enc.type_ids}
        return {
            getattr(self, role): np.asarray(arrays[role], dtype=np.int64)
            for role in ("ids", "mask", "types")
            if getattr(self, role) is not None
        }

    def collate(self, prepared: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        lengths = [len(p[self.ids]) for p in prepared]
        width = self.max_length if self.padding == "max_length" else max(lengths, default=0)
        feeds = {}
        for name, dtype in self.dtypes:
            fill = self.pad_id if name == self.ids else 0
            out = np.full((len(prepared), width), fill, dtype=dtype)
            for row, p in enumerate(prepared):
                out[row, : len(p[name])] = p[name]
            feeds[name] = out
        return feeds

    def __getstate__(self):
        # The tokenizer is made again from its JSON where the object lands (a worker process).
        state = dict(self.__dict__)
        state.pop("tokenizer", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)


def _tokenizer_config(text: str) -> dict[str, int]:
    """The tokenizer's own truncation length and pad id, checking that the library reads it."""
    try:
        _tokenizers().Tokenizer.from_str(text)
        data = json.loads(text)
    except Exception as exc:  # noqa: BLE001 - the library raises bare Exceptions for bad files
        msg = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise fail(
            "pre.tokenizer", f"not a tokenizer.json the tokenizers library can read ({msg})"
        ) from None
    config: dict[str, int] = {}
    if isinstance(data.get("truncation"), dict) and isinstance(
        data["truncation"].get("max_length"), int
    ):
        config["max_length"] = data["truncation"]["max_length"]
    if isinstance(data.get("padding"), dict) and isinstance(data["padding"].get("pad_id"), int):
        config["pad_id"] = data["padding"]["pad_id"]
    return config
