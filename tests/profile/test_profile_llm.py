"""LLM formulas: parameters against the published counts, 6·N·tokens, KV cache, prefill vs decode."""

from __future__ import annotations

import json

import pytest

from modelpress.errors import InputError
from modelpress.profile import config_from_dict, llm_workload, load_config
from modelpress.profile.workloads import llm_config

LLAMA2_7B_HF = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}


@pytest.mark.parametrize(
    ("name", "params"),
    [("llama-2-7b", 6_738_415_616), ("llama-2-70b", 68_976_648_192), ("gpt-j-6b", 6_050_882_784)],
)
def test_parameter_counts(name, params):
    # published counts (Hugging Face model cards / state dicts); GPT-J's biases are not modelled
    assert llm_config(name).params == pytest.approx(params, rel=2e-4)


def test_hf_config_matches_builtin(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA2_7B_HF))
    cfg = load_config(path)
    ref = llm_config("llama-2-7b")
    assert (
        cfg.layers,
        cfg.hidden,
        cfg.heads,
        cfg.kv_heads,
        cfg.intermediate,
        cfg.vocab,
        cfg.gated_mlp,
    ) == (
        ref.layers,
        ref.hidden,
        ref.heads,
        ref.kv_heads,
        ref.intermediate,
        ref.vocab,
        ref.gated_mlp,
    )
    assert cfg.params == ref.params


def test_training_is_six_n_per_token():
    cfg = llm_config("llama-2-7b")
    tokens = 1e9
    flops = cfg.training_flops(tokens, seq=2048)
    six_n = 6 * cfg.params * tokens
    # the attention term adds 3·4·L·h·(seq/2) per token = 12·32·4096·1024: +2.4% here
    assert flops == pytest.approx(
        6 * cfg.matmul_params * tokens + 12 * 32 * 4096 * 1024 * tokens, rel=1e-12
    )
    assert abs(flops / six_n - 1) < 0.05


def test_kv_cache_bytes_with_grouped_query_attention():
    # 2 (K and V) · layers · kv_heads · head_dim · bytes
    assert (
        llm_config("llama-2-7b").kv_cache_bytes(batch=1, context=1, bytes_per_elem=2)
        == 2 * 32 * 4096 * 2
    )
    assert (
        llm_config("llama-2-70b").kv_cache_bytes(batch=4, context=4096, bytes_per_elem=2)
        == 2 * 80 * 1024 * 2 * 4 * 4096
    )


def test_prefill_and_decode_kernels():
    cfg = llm_config("llama-2-7b")
    w = llm_workload(cfg, seq=512, gen_tokens=64)
    # forward over the prompt: per token 2·N_matmul + 4·L·h·(seq/2) (causal mean context)
    products = ("matmul", "attention")
    prefill = sum(k.flops for k in w.kernels if k.kind in products)
    assert prefill == pytest.approx(512 * cfg.forward_flops_per_token(256), rel=1e-9)
    step = sum(k.flops for k in w.decode if k.kind in products)
    assert step == pytest.approx(cfg.decode_flops(512 + 32), rel=1e-9)
    # norms and activations add well under 0.1%
    assert w.flops_per_sample / prefill - 1 < 1e-3
    # a decode step reads the whole KV cache at its context
    att = [k for k in w.decode if k.kind == "attention"]
    assert sum(k.in_elems for k in att) == pytest.approx(32 * (4096 + 2 * 4096 * (512 + 32)))
    assert w.unit == "tokens/s" and w.cache_elems == 2 * 32 * 4096 * 576


def test_bad_configs(tmp_path):
    with pytest.raises(InputError, match="no layers field"):
        config_from_dict({"hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10})
    with pytest.raises(InputError, match="divisible"):
        config_from_dict({**LLAMA2_7B_HF, "num_attention_heads": 3})
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        load_config(bad)
    with pytest.raises(InputError, match="exceeds the context"):
        llm_workload(llm_config("gpt-j-6b"), seq=2000, gen_tokens=100)
