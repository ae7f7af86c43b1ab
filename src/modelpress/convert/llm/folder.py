"""Write an LLM folder (``modelpress.ir.llm``'s layout) in one piece.

Everything is written into a staging folder beside the target and renamed into place at the end,
so a failed conversion leaves nothing behind and an existing folder is replaced whole or not at
all. ``model.onnx`` keeps its weights in ``model.onnx.data`` (one file beside it, any size).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import onnx

from modelpress.convert.llm.checkpoint import Checkpoint
from modelpress.errors import ModelSaveError
from modelpress.ir.files import replace_folder, staging_dir
from modelpress.ir.llm import CONFIG_FILE, MODEL_FILE, DecoderConfig, is_llm_folder

GENERATION_FILE = "generation_config.json"


def check_output(path: Path) -> None:
    """Refuse an output that is a file, or a folder holding anything but an earlier LLM folder."""
    if path.exists() and not path.is_dir():
        raise ModelSaveError(f"{path}: exists and is not a folder (an LLM is written as a folder)")
    if path.is_dir() and any(path.iterdir()) and not is_llm_folder(path):
        raise ModelSaveError(
            f"{path}: a folder that is not empty and not an LLM folder; choose a new output folder"
        )
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ModelSaveError(f"{path}: output directory {parent} does not exist")


def write_staged(stage: Path, model: onnx.ModelProto, config: DecoderConfig, ckpt: Checkpoint):
    """Write the folder's files into ``stage`` (an empty folder)."""
    try:
        onnx.save_model(
            model,
            str(stage / MODEL_FILE),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=MODEL_FILE + ".data",
            size_threshold=1024,
        )
        (stage / CONFIG_FILE).write_text(json.dumps(config.to_dict(), indent=2) + "\n")
        for name, content in ckpt.tokenizer.items():
            text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
            (stage / name).write_text(text)
        if ckpt.generation:
            (stage / GENERATION_FILE).write_text(json.dumps(ckpt.generation, indent=2) + "\n")
        # onnx writes its data file private (0600); the folder's files are as readable as any
        # file the user creates
        mask = os.umask(0)
        os.umask(mask)
        for f in stage.iterdir():
            os.chmod(f, 0o666 & ~mask)
    except (OSError, ValueError) as exc:
        raise ModelSaveError(f"{stage}: could not be written: {str(exc).splitlines()[0]}") from None


def publish(stage: Path, output: Path) -> None:
    """Move the staged folder to ``output``, replacing an earlier LLM folder there."""
    replace_folder(stage, output)


__all__ = ["GENERATION_FILE", "check_output", "publish", "staging_dir", "write_staged"]
