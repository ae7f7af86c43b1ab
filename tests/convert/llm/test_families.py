"""Every family: a tiny random-weight transformers model, converted, decodes as transformers does.

Each family's checkpoint comes from ``zoo.llm.tiny_checkpoint`` (transformers ``from_config`` at a
fixed seed, saved with ``save_pretrained``). The converted decoder's greedy tokens must equal
``generate(do_sample=False)``'s for 32 tokens on each prompt, and its prompt logits must be within
``RTOL`` of transformers' (relative to the largest logit: float32 sums in another order).
"""

from __future__ import annotations

import numpy as np
import pytest
from llm_convert_testing import OrtDecoder, encode, hf_greedy, hf_logits

from modelpress.convert.llm import convert_llm
from modelpress.ir.llm import read_config

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
zoo_llm = pytest.importorskip("modelpress.zoo.llm")

PROMPTS = [
    "The quick brown fox",
    "Hello world! How are you today?",
    "A language model predicts the next word from the words before it. Once upon a time",
]
STEPS = 32
RTOL = 1e-5

FAMILIES = [
    "llama",
    "llama-tied",
    "llama3-rope",
    "qwen2",
    "mistral",
    "gemma",
    "gemma2",  # 8-token sliding window on alternate layers, attention and final soft-capping
    "gemma3",  # q/k norms, local rope base on sliding layers
    "phi3",
    "phi3-longrope",  # the short prompts cross position 32, where the long factors take over
    "gpt2",
    "gpt_neox",
]


@pytest.fixture(scope="module", params=FAMILIES)
def converted(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    ckpt = zoo_llm.tiny_checkpoint(tmp / "ckpt", request.param, seed=0)
    result = convert_llm(ckpt, output=tmp / "llm")
    return request.param, result, zoo_llm.tiny_model(request.param, seed=0)


def test_greedy_equals_transformers(converted):
    family, result, model = converted
    decoder = OrtDecoder(result.output)
    eos = decoder.config.eos_token_ids
    for text in PROMPTS:
        prompt = encode(result.output, text)
        assert decoder.greedy(prompt, STEPS) == hf_greedy(model, prompt, STEPS, eos), (family, text)


def test_prompt_logits_match(converted):
    family, result, model = converted
    decoder = OrtDecoder(result.output)
    for text in PROMPTS:
        prompt = encode(result.output, text)
        expected = hf_logits(model, prompt)
        got = decoder.logits(prompt)
        assert np.abs(got - expected).max() <= RTOL * np.abs(expected).max(), family


def test_folder_and_config(converted):
    family, result, model = converted
    config = read_config(result.output)
    assert config.num_layers == model.config.num_hidden_layers
    assert config.kv_layout == "in_place" and config.level == "standard"
    assert result.verify is not None and result.verify.passed
    assert result.verify.steps == STEPS
    names = {p.name for p in result.output.iterdir()}
    assert {"model.onnx", "model.onnx.data", "tokenizer.json", "tokenizer_config.json"} <= names
    import json

    tok_config = json.loads((result.output / "tokenizer_config.json").read_text())
    assert "im_start" in tok_config["chat_template"]


def test_logits_to_keep(converted):
    """``logits_to_keep`` (an input with a default in the file): unfed, every position's logits;
    fed ``n``, the last ``n`` positions' alone, equal to those rows of the full output."""
    family, result, _ = converted
    decoder = OrtDecoder(result.output)
    overridable = {i.name for i in decoder.sess.get_overridable_initializers()}
    assert "logits_to_keep" in overridable, family
    prompt = encode(result.output, PROMPTS[2])
    ids = np.array([prompt], np.int64)
    feeds = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "position_ids": np.arange(ids.shape[1], dtype=np.int64)[None],
        **decoder.empty(1, room=ids.shape[1]),
    }
    (full,) = decoder.sess.run(["logits"], feeds)
    assert full.shape[1] == len(prompt)
    for keep in (1, 3):
        (last,) = decoder.sess.run(["logits"], {**feeds, "logits_to_keep": np.array(keep)})
        assert last.shape == (1, keep, full.shape[2]), family
        np.testing.assert_allclose(last, full[:, -keep:], rtol=0, atol=RTOL * np.abs(full).max())
