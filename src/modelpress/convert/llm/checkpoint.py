"""Read a decoder checkpoint: a Hugging Face folder or a GGUF file, into float32 numpy weights.

``read_checkpoint(path)`` returns a ``Checkpoint``: the transformers config (read with
``AutoConfig``, which also brings older config layouts to today's), the weights by their Hugging Face
names (read lazily, one tensor at a time, as float32), the tokenizer files and the generation
defaults. Nothing here needs torch.

Hugging Face folder: ``config.json``, ``*.safetensors`` (sharded with ``model.safetensors.index.json``
or not), ``tokenizer.json``, ``tokenizer_config.json``, optionally ``chat_template.jinja`` and
``generation_config.json``. Safetensors files are read by this module (a header and raw bytes,
memory-mapped): the ``safetensors`` package's numpy loader cannot return bfloat16, the dtype most
checkpoints ship in.

GGUF file: tensors are read and dequantized with the ``gguf`` package; the config and tokenizer come
from transformers' own GGUF reader (``gguf_file=``), so they are the ones the reference model uses.
llama.cpp stores the rows of Llama's Q and K projections permuted for its rope convention (pairs of
adjacent dimensions instead of two halves); ``_unpermute`` puts them back.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from modelpress.convert.llm.families import FAMILIES, supported
from modelpress.errors import ConversionError, require

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass
class Checkpoint:
    config: object  # transformers.PretrainedConfig
    weights: Mapping[str, np.ndarray]  # Hugging Face names, float32
    tokenizer: dict[str, dict | str]  # file name -> JSON object (or text)
    generation: dict = field(default_factory=dict)  # generation_config.json
    source: str = ""
    kind: str = "hf"  # "hf" or "gguf"


def _transformers():
    return require("transformers", extra="llm", purpose="converting a decoder LLM")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConversionError(
            f"{path}: not valid JSON ({str(exc).splitlines()[0][:120]})"
        ) from None
    if not isinstance(data, dict):
        raise ConversionError(f"{path}: expected a JSON object")
    return data


# --- safetensors -----------------------------------------------------------------------------

_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": np.uint16}


@dataclass(frozen=True)
class _Entry:
    path: Path
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    end: int


def _safetensors_index(path: Path) -> dict[str, _Entry]:
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ValueError("shorter than its header")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise ValueError("header runs past the end of the file")
            header = json.loads(f.read(n))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConversionError(f"{path}: not a valid safetensors file ({exc})") from None
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        if 8 + n + end > size:
            raise ConversionError(
                f"{path}: truncated (tensor {name!r} ends at byte {8 + n + end}, "
                f"the file has {size})"
            )
        out[name] = _Entry(path, info["dtype"], tuple(info["shape"]), 8 + n + begin, 8 + n + end)
    return out


class _LazyWeights(Mapping):
    """Tensors by name, read from their files (memory-mapped) as float32 when asked for."""

    def __init__(self, entries: dict[str, _Entry]):
        self._entries = entries
        self._maps: dict[Path, np.memmap] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        e = self._entries[name]
        if e.dtype not in _DTYPES:
            raise ConversionError(f"{e.path}: tensor {name!r} has dtype {e.dtype}, not a float")
        if e.path not in self._maps:
            self._maps[e.path] = np.memmap(e.path, dtype=np.uint8, mode="r")
        raw = self._maps[e.path][e.start : e.end].view(_DTYPES[e.dtype])
        if e.dtype == "BF16":  # bfloat16 is the top half of a float32
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        return np.asarray(raw, dtype=np.float32).reshape(e.shape)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(_read_json(index).get("weight_map", {}).values()))
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise ConversionError(f"{folder}: shard {missing[0]} named in {index.name} is missing")
        return [folder / s for s in shards]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConversionError(
            f"{folder}: no *.safetensors weights (PyTorch .bin checkpoints are not read; "
            "save the model with safetensors)"
        )
    return files


# --- Hugging Face folder ---------------------------------------------------------------------


def _tokenizer_files(folder: Path) -> dict[str, dict | str]:
    missing = [n for n in TOKENIZER_FILES if not (folder / n).is_file()]
    if missing:
        raise ConversionError(
            f"{folder}: {missing[0]} is missing (a decoder needs its fast tokenizer: "
            "tokenizer.json and tokenizer_config.json)"
        )
    out: dict[str, dict | str] = {n: _read_json(folder / n) for n in TOKENIZER_FILES}
    template = folder / "chat_template.jinja"
    if template.is_file() and "chat_template" not in out["tokenizer_config.json"]:
        out["tokenizer_config.json"]["chat_template"] = template.read_text()
    return out


def read_hf_folder(folder: Path) -> Checkpoint:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ConversionError(
            f"{folder}: config.json is missing (a Hugging Face checkpoint folder holds config.json, "
            "*.safetensors, tokenizer.json and tokenizer_config.json)"
        )
    raw = _read_json(config_path)
    model_type = raw.get("model_type")
    if model_type not in FAMILIES:
        raise ConversionError(
            f"{config_path}: architecture {model_type!r} is not supported (supported: {supported()})"
        )
    tokenizer = _tokenizer_files(folder)
    entries: dict[str, _Entry] = {}
    for f in _safetensors_files(folder):
        entries.update(_safetensors_index(f))
    transformers = _transformers()
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConversionError(f"{config_path}: {str(exc).splitlines()[0][:200]}") from None
    gen_path = folder / "generation_config.json"
    generation = _read_json(gen_path) if gen_path.is_file() else {}
    return Checkpoint(config, _LazyWeights(entries), tokenizer, generation, str(folder), "hf")


# --- GGUF ------------------------------------------------------------------------------------

# llama.cpp tensor names -> Hugging Face names, for the architectures whose layout is Llama's.
_GGUF_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_LAYER = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GGUF_ARCHITECTURES = ("llama", "qwen2")


def _hf_name(name: str) -> str | None:
    if name in _GGUF_GLOBAL:
        return _GGUF_GLOBAL[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _GGUF_LAYER:
        return f"model.layers.{parts[1]}.{_GGUF_LAYER[parts[2]]}.{parts[3]}"
    return None


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    # llama.cpp's convert_hf_to_gguf: reshape(heads, 2, dim/heads/2, ...).swapaxes(1, 2)
    shape = w.shape
    return w.reshape(heads, shape[0] // heads // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


class _GGUFWeights(Mapping):
    def __init__(self, reader, config, path: Path):
        self._tensors = {}
        for t in reader.tensors:
            hf = _hf_name(t.name)
            if hf is not None:
                self._tensors[hf] = t
        self._config = config
        self._path = path
        self._permuted = config.model_type == "llama"

    def __getitem__(self, name: str) -> np.ndarray:
        gguf = require("gguf", extra="llm", purpose="reading a GGUF file")
        t = self._tensors[name]
        try:
            w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        except (NotImplementedError, ValueError) as exc:
            raise ConversionError(
                f"{self._path}: tensor {t.name} ({t.tensor_type.name}) cannot be dequantized: {exc}"
            ) from None
        if self._permuted and name.endswith(("q_proj.weight", "k_proj.weight")):
            c = self._config
            heads = c.num_attention_heads if "q_proj" in name else c.num_key_value_heads
            w = _unpermute(w, heads)
        return w

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def read_gguf(path: Path) -> Checkpoint:
    gguf = require("gguf", extra="llm", purpose="reading a GGUF file")
    try:
        reader = gguf.GGUFReader(str(path))
        arch = reader.fields["general.architecture"].contents()
    except (ValueError, KeyError, IndexError, OSError, struct.error) as exc:
        raise ConversionError(
            f"{path}: not a readable GGUF file ({str(exc).splitlines()[0][:150]}); is it truncated?"
        ) from None
    if arch not in GGUF_ARCHITECTURES:
        raise ConversionError(
            f"{path}: GGUF architecture {arch!r} is not supported "
            f"(supported in GGUF files: {', '.join(GGUF_ARCHITECTURES)})"
        )
    transformers = _transformers()
    folder, name = str(path.parent), path.name
    try:
        config = transformers.AutoConfig.from_pretrained(folder, gguf_file=name)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except (OSError, ValueError, KeyError) as exc:
        raise ConversionError(f"{path}: {str(exc).splitlines()[0][:200]}") from None
    with tempfile.TemporaryDirectory(prefix="modelpress-tok-") as tmp:
        tokenizer.save_pretrained(tmp)
        files = _tokenizer_files(Path(tmp))
    generation = {
        k: getattr(config, k)
        for k in ("bos_token_id", "eos_token_id", "pad_token_id")
        if getattr(config, k, None) is not None
    }
    weights = _GGUFWeights(reader, config, path)
    return Checkpoint(config, weights, files, generation, str(path), "gguf")


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """The ``Checkpoint`` at ``path`` (a Hugging Face folder or a ``.gguf`` file)."""
    p = Path(path)
    if not p.exists():
        raise ConversionError(f"{p}: no such file or directory")
    if p.is_dir():
        return read_hf_folder(p)
    if p.suffix.lower() == ".gguf":
        return read_gguf(p)
    raise ConversionError(f"{p}: not a decoder checkpoint (a Hugging Face folder or a .gguf file)")
