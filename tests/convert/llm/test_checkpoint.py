"""Reading checkpoints: sharded bfloat16 safetensors (how most real checkpoints ship), the GGUF
Q/K row permutation, and the CLI on a decoder checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from modelpress.convert import convert
from modelpress.convert.llm.checkpoint import _unpermute, read_checkpoint

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
zoo_llm = pytest.importorskip("modelpress.zoo.llm")


def test_sharded_bfloat16(tmp_path):
    model = zoo_llm.tiny_model("qwen2", seed=3).to(torch.bfloat16)
    src = tmp_path / "ckpt"
    model.save_pretrained(src, max_shard_size="60KB")
    zoo_llm.tiny_tokenizer().save_pretrained(src)
    assert (src / "model.safetensors.index.json").is_file()
    assert len(list(src.glob("*.safetensors"))) > 1
    ckpt = read_checkpoint(src)
    for name, p in model.state_dict().items():
        if name in ckpt.weights:
            np.testing.assert_array_equal(ckpt.weights[name], p.float().numpy(), err_msg=name)
    result = convert(src, output=tmp_path / "llm")  # verified against transformers (float32)
    assert result.verify.passed


def test_unpermute_inverts_llama_cpp_permutation():
    heads, head_dim, hidden = 3, 8, 5
    w = np.arange(heads * head_dim * hidden, dtype=np.float32).reshape(heads * head_dim, hidden)
    # llama.cpp's convert_hf_to_gguf permute()
    permuted = (
        w.reshape(heads, 2, head_dim // 2, hidden).swapaxes(1, 2).reshape(heads * head_dim, hidden)
    )
    np.testing.assert_array_equal(_unpermute(permuted, heads), w)


def test_cli_convert_and_bad_input(tmp_path):
    src = zoo_llm.tiny_checkpoint(tmp_path / "ckpt", "llama", seed=0)
    cmd = [sys.executable, "-m", "modelpress.cli.main", "convert"]
    out = subprocess.run(
        [*cmd, str(src), "-o", str(tmp_path / "llm"), "--json", str(tmp_path / "rec.json")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "greedy tokens equal" in out.stdout
    record = json.loads((tmp_path / "rec.json").read_text())
    assert record["result"]["verify"]["passed"]
    (src / "tokenizer.json").unlink()
    bad = subprocess.run(
        [*cmd, str(src), "-o", str(tmp_path / "llm2")], capture_output=True, text=True
    )
    assert bad.returncode == 1
    lines = [ln for ln in bad.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "tokenizer.json" in lines[0]
    assert not (tmp_path / "llm2").exists()
