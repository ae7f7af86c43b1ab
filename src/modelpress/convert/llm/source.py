"""The decoder checkpoints ``modelpress convert`` recognizes, in the converter registry.

A folder that looks like a Hugging Face checkpoint (``config.json``, ``*.safetensors`` or
``tokenizer.json``; not a TensorFlow SavedModel) and a ``.gguf`` file. ``convert()`` hands both to
``convert_llm``, which writes an LLM folder instead of one ONNX file.
"""

from __future__ import annotations

import os
from pathlib import Path

from modelpress.convert.base import ConversionError, ConvertOptions, Exported, has_suffix, register

HF_MARKERS = ("config.json", "tokenizer.json", "model.safetensors.index.json")


def _is_hf_folder(source: object) -> bool:
    if not isinstance(source, (str, os.PathLike)):
        return False
    p = Path(source)
    if not p.is_dir() or (p / "saved_model.pb").is_file():
        return False
    return any((p / m).is_file() for m in HF_MARKERS) or any(p.glob("*.safetensors"))


def _not_here(source, options: ConvertOptions) -> Exported:
    raise ConversionError(f"{source}: a decoder checkpoint is converted by `convert_llm`")


register(
    "hf-llm",
    description="a Hugging Face decoder folder (config.json, *.safetensors, tokenizer.json)",
    extra="llm",
    accepts=_is_hf_folder,
    llm=True,
)(_not_here)
register(
    "gguf",
    description="a GGUF decoder file (.gguf, llama.cpp's format)",
    extra="llm",
    accepts=has_suffix(".gguf"),
    llm=True,
)(_not_here)
