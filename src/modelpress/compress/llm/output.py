"""Write a quantized LLM folder in one piece: staged beside the target, renamed into place.

Everything but the decoder and its config is copied as it was (tokenizer, chat template,
generation settings). A failed write leaves the target as it was; an earlier LLM folder at the
target is replaced whole.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx_ir as ir

from modelpress.errors import ModelSaveError
from modelpress.ir import llm, save
from modelpress.ir.files import replace_folder, staging_dir, write_json


def check_output(path: Path, source: Path) -> None:
    if path.exists() and not path.is_dir():
        raise ModelSaveError(f"{path}: exists and is not a folder (an LLM is written as a folder)")
    if path.is_dir() and any(path.iterdir()) and not llm.is_llm_folder(path):
        raise ModelSaveError(
            f"{path}: a folder that is not empty and not an LLM folder; choose a new output folder"
        )
    if path.resolve() == source.resolve():
        raise ModelSaveError(f"{path}: the output folder must not be the input folder")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ModelSaveError(f"{path}: output directory {parent} does not exist")


def write_folder(source: Path, output: Path, model: ir.Model, config: llm.DecoderConfig) -> Path:
    """``output`` holding ``model`` and ``config``, and ``source``'s other files."""
    check_output(output, source)
    skip = {llm.MODEL_FILE, llm.MODEL_FILE + ".data", llm.CONFIG_FILE}
    with staging_dir(output) as tmp:
        stage = tmp / output.name
        stage.mkdir()
        save(model, stage / llm.MODEL_FILE, external_data=True)
        write_json(stage / llm.CONFIG_FILE, config.to_dict())
        try:
            for f in source.iterdir():
                if f.is_file() and f.name not in skip:
                    shutil.copy2(f, stage / f.name)
        except OSError as exc:
            raise ModelSaveError(f"{output}: could not be written: {exc}") from None
        replace_folder(stage, output)
    return output
