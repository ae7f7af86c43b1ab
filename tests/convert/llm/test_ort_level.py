"""The ``ort`` level (ONNX Runtime's GroupQueryAttention, Skip*LayerNormalization): the same
greedy tokens as transformers, its cache left-aligned, and what it cannot express refused."""

from __future__ import annotations

import pytest
from llm_convert_testing import OrtDecoder, encode, hf_greedy

from modelpress.convert.llm import convert_llm
from modelpress.errors import ConversionError
from modelpress.ir.llm import read_config

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
zoo_llm = pytest.importorskip("modelpress.zoo.llm")

PROMPTS = ["The quick brown fox", "Hello world! How are you today?"]
STEPS = 32
FAMILIES = ["llama", "qwen2", "gemma2", "gemma3", "phi3-longrope", "gpt2"]


@pytest.mark.parametrize("family", FAMILIES)
def test_ort_level_greedy_equals_transformers(family, tmp_path):
    ckpt = zoo_llm.tiny_checkpoint(tmp_path / "ckpt", family, seed=0)
    result = convert_llm(ckpt, output=tmp_path / "llm", level="ort")  # verified, right-padded too
    config = read_config(result.output)
    assert (config.level, config.kv_layout) == ("ort", "left_aligned")
    model = zoo_llm.tiny_model(family, seed=0)
    decoder = OrtDecoder(result.output)
    nodes = __import__("onnx").load(str(result.output / "model.onnx")).graph.node
    ops = {n.op_type for n in nodes}
    assert "GroupQueryAttention" in ops and "Attention" not in ops
    # the final norm's fused residual sum is read by nothing: the node does not write it
    final = [n for n in nodes if n.name == "model.norm"]
    assert len(final) == 1 and list(final[0].output) == ["model.norm/out"], family
    for text in PROMPTS:
        prompt = encode(result.output, text)
        expected = hf_greedy(model, prompt, STEPS, config.eos_token_ids)
        assert decoder.greedy(prompt, STEPS) == expected, (family, text)


def test_ort_level_refuses_a_rotary_dim_it_cannot_do(tmp_path):
    ckpt = zoo_llm.tiny_checkpoint(tmp_path / "ckpt", "gpt_neox", seed=0)  # rotates 4 of 16
    with pytest.raises(ConversionError, match="level 'ort'.*use level 'standard'"):
        convert_llm(ckpt, output=tmp_path / "llm", level="ort")
    assert not (tmp_path / "llm").exists()
