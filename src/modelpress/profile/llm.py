"""Analytic cost of decoder-only language models from their configuration.

A model is described by its shape (a Hugging Face ``config.json`` works): layers L, hidden size h,
attention heads a and key/value heads a_kv (grouped-query attention when a_kv < a), MLP width i
(gated MLPs such as SwiGLU have three matrices, plain ones two), vocabulary V. Standard formulas:

- parameters N = V·h (embedding) + L·(2·h·h + 2·h·a_kv·d + m·h·i) + V·h (LM head unless tied),
  with d = h/a and m = 3 (gated) or 2;
- forward FLOPs per token ≈ 2·N_matmul + 4·L·h·c, where the second term is QKᵀ and AV over a
  context of c tokens (c is half the sequence for causal prefill, the KV length when decoding);
- training ≈ 6·N·tokens (Kaplan et al. 2020) plus three times the attention term;
- KV cache = 2 · L · a_kv · d · context · batch · bytes per element.

Prefill processes the prompt at once (compute-bound), decode one token per step, reading every
weight and the whole KV cache each step (memory-bound at small batches).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from modelpress.errors import InputError
from modelpress.profile.workload import Kernel, Workload

# Hugging Face config keys that mean the same thing across model families.
_KEYS = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model", "dim"),
    "heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "kv_heads": ("num_key_value_heads", "n_kv_heads", "multi_query_group_num"),
    "intermediate": ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"),
    "vocab": ("vocab_size", "padded_vocab_size"),
    "context": ("max_position_embeddings", "n_positions", "seq_length", "max_seq_len"),
}
# Families whose MLP is gated (SwiGLU/GeGLU: gate, up and down matrices).
_GATED_FAMILIES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "phi3",
    "olmo",
    "internlm2",
)


@dataclass(frozen=True)
class LLMConfig:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    context: int
    gated_mlp: bool
    tied_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        attn = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_dim
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.intermediate
        return attn + mlp + 2 * self.hidden  # two norms

    @property
    def params(self) -> int:
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.vocab * self.hidden + self.layers * self.layer_params + head + self.hidden

    @property
    def matmul_params(self) -> int:
        """Parameters used in matrix products per token: all but the embedding lookup and norms."""
        return self.layers * (self.layer_params - 2 * self.hidden) + self.vocab * self.hidden

    def forward_flops_per_token(self, context: float) -> float:
        return 2.0 * self.matmul_params + 4.0 * self.layers * self.hidden * context

    def training_flops(self, tokens: float, seq: int) -> float:
        """≈ 6·N·tokens, plus the attention term at the causal mean context seq/2."""
        return 3.0 * tokens * self.forward_flops_per_token(seq / 2)

    def kv_cache_bytes(self, *, batch: int, context: int, bytes_per_elem: float) -> float:
        return 2.0 * self.layers * self.kv_dim * context * batch * bytes_per_elem

    def prefill_flops(self, prompt: int) -> float:
        return prompt * self.forward_flops_per_token(prompt / 2)

    def decode_flops(self, context: int) -> float:
        return self.forward_flops_per_token(context)


def _pick(data: dict, field: str, path: str, default=None):
    for key in _KEYS[field]:
        if data.get(key) is not None:
            return data[key]
    if default is not None:
        return default
    raise InputError(f"{path}: no {field} field (looked for {', '.join(_KEYS[field])})")


def config_from_dict(data: dict, *, name: str = "llm", path: str = "config") -> LLMConfig:
    """An ``LLMConfig`` from Hugging Face config fields."""
    if isinstance(data.get("text_config"), dict):  # multimodal wrappers keep the LM inside
        data = {**data, **data["text_config"]}
    hidden = int(_pick(data, "hidden", path))
    heads = int(_pick(data, "heads", path))
    family = str(data.get("model_type", "")).lower()
    act = str(data.get("hidden_act", data.get("activation_function", ""))).lower()
    gated = family in _GATED_FAMILIES or act in ("swiglu", "geglu")
    try:
        cfg = LLMConfig(
            name=name,
            layers=int(_pick(data, "layers", path)),
            hidden=hidden,
            heads=heads,
            kv_heads=int(_pick(data, "kv_heads", path, default=heads)),
            intermediate=int(_pick(data, "intermediate", path, default=4 * hidden)),
            vocab=int(_pick(data, "vocab", path)),
            context=int(_pick(data, "context", path, default=2048)),
            gated_mlp=gated,
            tied_embeddings=bool(data.get("tie_word_embeddings", False)),
        )
    except (TypeError, ValueError) as exc:
        raise InputError(f"{path}: a size field is not an integer ({exc})") from None
    if (
        min(cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.vocab) <= 0
        or cfg.hidden % cfg.heads
    ):
        raise InputError(
            f"{path}: sizes must be positive and hidden_size divisible by the number of heads"
        )
    return cfg


def load_config(path: str | Path) -> LLMConfig:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise InputError(f"{p}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InputError(f"{p}: expected a JSON object with model sizes")
    return config_from_dict(data, name=p.parent.name or p.stem, path=str(p))


def _layer_kernels(cfg: LLMConfig, *, tokens: int, context: float, kv_read: bool) -> list[Kernel]:
    """Kernels of one decoder layer for a sequence contributing ``tokens`` new tokens.

    ``context`` is the number of keys each new token attends to (on average). With ``kv_read``
    the keys and values come from the KV cache (decode), otherwise from this pass (prefill).
    """
    h, kv, i, t = cfg.hidden, cfg.kv_dim, cfg.intermediate, tokens
    qkv_out = h + 2 * kv
    mlp_in = (2 if cfg.gated_mlp else 1) * i
    kv_elems = 2 * kv * (context if kv_read else t)
    return [
        Kernel("input_norm", "norm", 4.0 * t * h, h, t * h, t * h),
        Kernel(
            "qkv_proj",
            "matmul",
            2.0 * t * h * qkv_out,
            h * qkv_out,
            t * h,
            t * qkv_out,
            out_cols=qkv_out,
        ),
        # fused (flash) attention: reads Q and the keys/values once, writes the context
        Kernel("attention", "attention", 4.0 * t * context * h, 0, t * h + kv_elems, t * h),
        Kernel("out_proj", "matmul", 2.0 * t * h * h, h * h, t * h, t * h, out_cols=h),
        Kernel("residual", "elementwise", 1.0 * t * h, 0, 2 * t * h, t * h, fusable=True),
        Kernel("post_norm", "norm", 4.0 * t * h, h, t * h, t * h),
        Kernel(
            "mlp_in", "matmul", 2.0 * t * h * mlp_in, h * mlp_in, t * h, t * mlp_in, out_cols=mlp_in
        ),
        Kernel("mlp_act", "elementwise", 5.0 * t * i, 0, t * mlp_in, t * i, fusable=True),
        Kernel("mlp_out", "matmul", 2.0 * t * i * h, i * h, t * i, t * h, out_cols=h),
        Kernel("residual", "elementwise", 1.0 * t * h, 0, 2 * t * h, t * h, fusable=True),
    ]


def _pass_kernels(
    cfg: LLMConfig, *, tokens: int, context: float, kv_read: bool, logits_tokens: int
) -> tuple[Kernel, ...]:
    h, v = cfg.hidden, cfg.vocab
    kernels = [Kernel("embedding", "memory", 0.0, 0, tokens, tokens * h)]
    layer = _layer_kernels(cfg, tokens=tokens, context=context, kv_read=kv_read)
    for n in range(cfg.layers):
        kernels.extend(
            Kernel(
                f"layer{n}.{k.name}",
                k.kind,
                k.flops,
                k.weight_elems,
                k.in_elems,
                k.out_elems,
                k.fusable,
                k.out_cols,
            )
            for k in layer
        )
    t = logits_tokens
    kernels.append(Kernel("final_norm", "norm", 4.0 * tokens * h, h, tokens * h, tokens * h))
    kernels.append(Kernel("lm_head", "matmul", 2.0 * t * h * v, h * v, t * h, t * v, out_cols=v))
    return tuple(kernels)


def llm_workload(cfg: LLMConfig, *, seq: int, gen_tokens: int = 128) -> Workload:
    """Workload of one sequence: ``seq`` prompt (or training) tokens, then ``gen_tokens`` decoded.

    The forward kernels cover the whole sequence (training, prefill); ``decode`` is one step at
    the mean context of generation, seq + gen_tokens/2.
    """
    if seq <= 0:
        raise InputError(f"{cfg.name}: `seq` must be positive")
    if seq + gen_tokens > cfg.context:
        raise InputError(
            f"{cfg.name}: `seq` {seq} + {gen_tokens} generated tokens exceeds the context of {cfg.context}"
        )
    forward = _pass_kernels(cfg, tokens=seq, context=seq / 2, kv_read=False, logits_tokens=seq)
    decode = _pass_kernels(
        cfg, tokens=1, context=seq + gen_tokens / 2, kv_read=True, logits_tokens=1
    )
    return Workload(
        name=cfg.name,
        kernels=forward,
        params=float(cfg.params),
        sample=f"sequence of {seq} tokens" + (f" + {gen_tokens} generated" if gen_tokens else ""),
        tokens_per_sample=seq,
        unit="tokens/s",
        decode=decode if gen_tokens else (),
        gen_tokens=gen_tokens,
        cache_elems=2.0 * cfg.layers * cfg.kv_dim * (seq + gen_tokens),
    )


__all__ = ["LLMConfig", "config_from_dict", "llm_workload", "load_config"]
