"""The decoder families modelpress converts: a registry from transformers' ``model_type`` to a spec.

A ``Spec`` says everything the graph builder needs (sizes, norms, activation, rope per layer,
sliding-window layers, soft-capping, residual layout); ``Family.layer(weights, spec, i)`` hands the
weights of layer ``i`` in one canonical form whatever the checkpoint called them:

``q``, ``k``, ``v``, ``o``, ``gate``, ``up``, ``down``  ``[out, in]`` (``torch.nn.Linear``'s layout)
with optional ``*_bias``; norms ``attn_norm``, ``mlp_norm`` (and ``post_attn_norm``,
``post_mlp_norm`` for Gemma's sandwich, ``q_norm``/``k_norm``) with ``*_bias`` for LayerNorm.
``Family.globals`` hands ``embed`` ``[vocab, hidden]``, ``lm_head`` ``[vocab, hidden]``,
``final_norm`` (``final_norm_bias``) and ``positions`` (GPT-2's learned table).

Gemma's RMSNorm multiplies by ``1 + w``: the spec's ``norm_offset`` is added to every norm weight
when the graph is built, so the graph has one plain RMSNorm.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from modelpress.convert.llm.rope import Rope, rope_from_params
from modelpress.errors import ConversionError

Weights = Mapping[str, np.ndarray]


@dataclass
class Spec:
    family: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_context: int
    norm: str = "rms"  # "rms" or "layer"
    norm_eps: float = 1e-6
    norm_offset: float = 0.0  # Gemma: the norm multiplies by (1 + w)
    activation: str = "silu"  # silu, gelu_tanh, gelu
    gated_mlp: bool = True
    positions: str = "rope"  # "rope" or "learned"
    rope: list[Rope] = field(default_factory=list)  # per layer (empty for learned positions)
    rotary_dim: int = 0  # the leading part of each head that rotates (NeoX: a fraction)
    query_scale: float = 0.0  # multiplies q·k (0: 1/sqrt(head_dim))
    sliding: list[bool] = field(default_factory=list)  # per layer: attends within a window
    sliding_window: int | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    embed_scale: float | None = None  # Gemma multiplies embeddings by sqrt(hidden)
    sandwich_norms: bool = False  # Gemma 2/3: norms after attention and MLP too
    qk_norm: bool = False  # Gemma 3: RMSNorm over each head of q and k
    parallel_residual: bool = False  # GPT-NeoX: x + attn(ln1 x) + mlp(ln2 x)

    @property
    def scale(self) -> float:
        return self.query_scale or self.head_dim**-0.5


@dataclass(frozen=True)
class Family:
    name: str  # what DecoderConfig.family says
    model_types: tuple[str, ...]  # transformers' model_type values it covers
    spec: Callable[[object], Spec]  # transformers config -> Spec
    layer: Callable[[Weights, Spec, int], dict[str, np.ndarray]]
    globals: Callable[[Weights, Spec, object], dict[str, np.ndarray]]


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    for t in family.model_types:
        FAMILIES[t] = family
    return family


def supported() -> str:
    return ", ".join(sorted(FAMILIES))


def family_of(config: object, *, where: str) -> Family:
    """The registered family of a transformers config, or one line naming the supported ones."""
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        raise ConversionError(
            f"{where}: architecture {model_type!r} is not supported (supported: {supported()})"
        )
    return FAMILIES[model_type]


def get(weights: Weights, name: str, *, where: str = "the checkpoint") -> np.ndarray:
    try:
        return weights[name]
    except KeyError:
        raise ConversionError(f"{where}: weight {name!r} is missing") from None


def _opt(weights: Weights, name: str) -> np.ndarray | None:
    return weights[name] if name in weights else None


# --- shared pieces ---------------------------------------------------------------------------


def _head_dim(c) -> int:
    return getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads


def _ropes(c, spec: Spec, layer_types: list[str]) -> list[Rope]:
    params = c.rope_parameters or {"rope_type": "default", "rope_theta": 10000.0}
    dim = spec.rotary_dim
    where = f"{c.model_type} config rope_parameters"
    if all(isinstance(v, dict) for v in params.values()):  # per layer type (Gemma 3)
        by_type = {
            t: rope_from_params(p, dim=dim, max_pos=spec.max_context, where=where)
            for t, p in params.items()
        }
        return [by_type[t] for t in layer_types]
    rope = rope_from_params(params, dim=dim, max_pos=spec.max_context, where=where)
    return [rope] * spec.num_layers


def _layer_types(c) -> list[str]:
    types = getattr(c, "layer_types", None)
    return list(types) if types else ["full_attention"] * c.num_hidden_layers


def _window(c, types: list[str]) -> tuple[list[bool], int | None]:
    sliding = [t == "sliding_attention" for t in types]
    window = getattr(c, "sliding_window", None)
    if not any(sliding) or not window:
        return [False] * len(types), None
    return sliding, int(window)


def _activation(c, name: str) -> str:
    acts = {
        "silu": "silu",
        "swish": "silu",
        "gelu_pytorch_tanh": "gelu_tanh",
        "gelu_new": "gelu_tanh",
        "gelu_fast": "gelu_tanh",
        "gelu": "gelu",
    }
    if name not in acts:
        raise ConversionError(
            f"{c.model_type} config: activation {name!r} is not supported "
            f"(supported: {', '.join(sorted(acts))})"
        )
    return acts[name]


def _rope_spec(c, family: str, **extra) -> Spec:
    head_dim = _head_dim(c)
    types = _layer_types(c)
    sliding, window = _window(c, types)
    params = c.rope_parameters or {}
    flat = params if not all(isinstance(v, dict) for v in params.values()) else {}
    partial = flat.get("partial_rotary_factor", getattr(c, "partial_rotary_factor", 1.0)) or 1.0
    spec = Spec(
        family=family,
        num_layers=c.num_hidden_layers,
        hidden=c.hidden_size,
        num_heads=c.num_attention_heads,
        num_kv_heads=getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
        head_dim=head_dim,
        vocab_size=c.vocab_size,
        max_context=c.max_position_embeddings,
        norm_eps=float(getattr(c, "rms_norm_eps", 1e-6)),
        activation=_activation(c, getattr(c, "hidden_act", "silu")),
        rotary_dim=int(head_dim * partial),
        sliding=sliding,
        sliding_window=window,
        **extra,
    )
    spec.rope = _ropes(c, spec, types)
    return spec


def _llama_layer(w: Weights, spec: Spec, i: int) -> dict[str, np.ndarray]:
    p = f"model.layers.{i}."
    out = {
        "attn_norm": get(w, p + "input_layernorm.weight"),
        "o": get(w, p + "self_attn.o_proj.weight"),
        "gate": get(w, p + "mlp.gate_proj.weight"),
        "up": get(w, p + "mlp.up_proj.weight"),
        "down": get(w, p + "mlp.down_proj.weight"),
    }
    for n in ("q", "k", "v"):
        out[n] = get(w, p + f"self_attn.{n}_proj.weight")
        bias = _opt(w, p + f"self_attn.{n}_proj.bias")
        if bias is not None:
            out[n + "_bias"] = bias
    for n, name in (("o_bias", "self_attn.o_proj.bias"), ("down_bias", "mlp.down_proj.bias")):
        bias = _opt(w, p + name)
        if bias is not None:
            out[n] = bias
    for n in ("gate", "up"):
        bias = _opt(w, p + f"mlp.{n}_proj.bias")
        if bias is not None:
            out[n + "_bias"] = bias
    if spec.sandwich_norms:
        out["post_attn_norm"] = get(w, p + "post_attention_layernorm.weight")
        out["mlp_norm"] = get(w, p + "pre_feedforward_layernorm.weight")
        out["post_mlp_norm"] = get(w, p + "post_feedforward_layernorm.weight")
    else:
        out["mlp_norm"] = get(w, p + "post_attention_layernorm.weight")
    if spec.qk_norm:
        out["q_norm"] = get(w, p + "self_attn.q_norm.weight")
        out["k_norm"] = get(w, p + "self_attn.k_norm.weight")
    return out


def _embeddings(w: Weights, c, embed: str, head: str, *, tied: bool = False) -> dict:
    """The token embeddings and the LM head: the same table when the config ties them (``tied``:
    the family's default) or the checkpoint has no head of its own."""
    table = get(w, embed)
    tied = getattr(c, "tie_word_embeddings", tied) or head not in w
    return {"embed": table, "lm_head": table if tied else get(w, head)}


def _llama_globals(w: Weights, spec: Spec, c) -> dict[str, np.ndarray]:
    return {
        **_embeddings(w, c, "model.embed_tokens.weight", "lm_head.weight"),
        "final_norm": get(w, "model.norm.weight"),
    }


# --- Llama, Mistral, Qwen2 -------------------------------------------------------------------


def _llama_spec(c) -> Spec:
    return _rope_spec(c, c.model_type)


register(Family("llama", ("llama", "mistral", "qwen2"), _llama_spec, _llama_layer, _llama_globals))


# --- Gemma 2 and 3 ---------------------------------------------------------------------------


def _gemma_spec(c) -> Spec:
    # Gemma configs name the MLP's activation ``hidden_activation``.
    act = getattr(c, "hidden_activation", None) or getattr(c, "hidden_act", "gelu_pytorch_tanh")
    first = c.model_type == "gemma"
    scalar = getattr(c, "query_pre_attn_scalar", None)
    spec = _rope_spec(
        c,
        c.model_type,
        norm_offset=1.0,
        query_scale=scalar**-0.5 if scalar else 0.0,
        attn_softcap=getattr(c, "attn_logit_softcapping", None),
        final_softcap=getattr(c, "final_logit_softcapping", None),
        # transformers multiplies by sqrt(hidden) rounded to the weights' dtype
        embed_scale=float(np.float32(c.hidden_size**0.5)),
        sandwich_norms=not first,
        qk_norm=c.model_type == "gemma3_text",
    )
    spec.activation = _activation(c, act)
    return spec


register(
    Family("gemma", ("gemma", "gemma2", "gemma3_text"), _gemma_spec, _llama_layer, _llama_globals)
)


# --- Phi-3: fused q|k|v and gate|up ----------------------------------------------------------


def _phi3_layer(w: Weights, spec: Spec, i: int) -> dict[str, np.ndarray]:
    p = f"model.layers.{i}."
    nq, nkv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    qkv = get(w, p + "self_attn.qkv_proj.weight")
    gate_up = get(w, p + "mlp.gate_up_proj.weight")
    inter = gate_up.shape[0] // 2
    return {
        "attn_norm": get(w, p + "input_layernorm.weight"),
        "mlp_norm": get(w, p + "post_attention_layernorm.weight"),
        "q": qkv[:nq],
        "k": qkv[nq : nq + nkv],
        "v": qkv[nq + nkv :],
        "o": get(w, p + "self_attn.o_proj.weight"),
        "gate": gate_up[:inter],
        "up": gate_up[inter:],
        "down": get(w, p + "mlp.down_proj.weight"),
    }


register(Family("phi3", ("phi3",), _llama_spec, _phi3_layer, _llama_globals))


# --- GPT-2: learned positions, LayerNorm, Conv1D weights stored [in, out] ----------------------


def _gpt2_spec(c) -> Spec:
    if getattr(c, "scale_attn_by_inverse_layer_idx", False):
        raise ConversionError("gpt2 config: scale_attn_by_inverse_layer_idx is not supported")
    heads = c.n_head
    return Spec(
        family="gpt2",
        num_layers=c.n_layer,
        hidden=c.n_embd,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=c.n_embd // heads,
        vocab_size=c.vocab_size,
        max_context=c.n_positions,
        norm="layer",
        norm_eps=float(c.layer_norm_epsilon),
        activation=_activation(c, c.activation_function),
        gated_mlp=False,
        positions="learned",
        # without scale_attn_weights GPT-2 does not divide by sqrt(head_dim)
        query_scale=1.0 if not getattr(c, "scale_attn_weights", True) else 0.0,
    )


def _gpt2_layer(w: Weights, spec: Spec, i: int) -> dict[str, np.ndarray]:
    p = f"transformer.h.{i}."
    h = spec.hidden
    qkv, qkv_b = get(w, p + "attn.c_attn.weight").T, get(w, p + "attn.c_attn.bias")
    return {
        "attn_norm": get(w, p + "ln_1.weight"),
        "attn_norm_bias": get(w, p + "ln_1.bias"),
        "mlp_norm": get(w, p + "ln_2.weight"),
        "mlp_norm_bias": get(w, p + "ln_2.bias"),
        "q": qkv[:h],
        "k": qkv[h : 2 * h],
        "v": qkv[2 * h :],
        "q_bias": qkv_b[:h],
        "k_bias": qkv_b[h : 2 * h],
        "v_bias": qkv_b[2 * h :],
        "o": get(w, p + "attn.c_proj.weight").T,
        "o_bias": get(w, p + "attn.c_proj.bias"),
        "up": get(w, p + "mlp.c_fc.weight").T,
        "up_bias": get(w, p + "mlp.c_fc.bias"),
        "down": get(w, p + "mlp.c_proj.weight").T,
        "down_bias": get(w, p + "mlp.c_proj.bias"),
    }


def _gpt2_globals(w: Weights, spec: Spec, c) -> dict[str, np.ndarray]:
    return {
        **_embeddings(w, c, "transformer.wte.weight", "lm_head.weight", tied=True),
        "positions": get(w, "transformer.wpe.weight"),
        "final_norm": get(w, "transformer.ln_f.weight"),
        "final_norm_bias": get(w, "transformer.ln_f.bias"),
    }


register(Family("gpt2", ("gpt2",), _gpt2_spec, _gpt2_layer, _gpt2_globals))


# --- GPT-NeoX: partial rotary, parallel residual, q|k|v interleaved per head ------------------


def _neox_spec(c) -> Spec:
    spec = _rope_spec(c, "gpt_neox", norm="layer", gated_mlp=False)
    spec.norm_eps = float(c.layer_norm_eps)
    spec.parallel_residual = bool(c.use_parallel_residual)
    return spec


def _neox_layer(w: Weights, spec: Spec, i: int) -> dict[str, np.ndarray]:
    p = f"gpt_neox.layers.{i}."
    nh, d = spec.num_heads, spec.head_dim
    # rows are [head][q, k, v][head_dim]: regroup as all q heads, all k heads, all v heads
    qkv = get(w, p + "attention.query_key_value.weight").reshape(nh, 3, d, spec.hidden)
    out = {
        "attn_norm": get(w, p + "input_layernorm.weight"),
        "attn_norm_bias": get(w, p + "input_layernorm.bias"),
        "mlp_norm": get(w, p + "post_attention_layernorm.weight"),
        "mlp_norm_bias": get(w, p + "post_attention_layernorm.bias"),
        "o": get(w, p + "attention.dense.weight"),
        "up": get(w, p + "mlp.dense_h_to_4h.weight"),
        "up_bias": get(w, p + "mlp.dense_h_to_4h.bias"),
        "down": get(w, p + "mlp.dense_4h_to_h.weight"),
        "down_bias": get(w, p + "mlp.dense_4h_to_h.bias"),
    }
    bias = _opt(w, p + "attention.query_key_value.bias")
    for k, n in enumerate("qkv"):
        out[n] = qkv[:, k].reshape(nh * d, spec.hidden)
        if bias is not None:
            out[n + "_bias"] = bias.reshape(nh, 3, d)[:, k].reshape(nh * d)
    o_bias = _opt(w, p + "attention.dense.bias")
    if o_bias is not None:
        out["o_bias"] = o_bias
    return out


def _neox_globals(w: Weights, spec: Spec, c) -> dict[str, np.ndarray]:
    return {
        **_embeddings(w, c, "gpt_neox.embed_in.weight", "embed_out.weight"),
        "final_norm": get(w, "gpt_neox.final_layer_norm.weight"),
        "final_norm_bias": get(w, "gpt_neox.final_layer_norm.bias"),
    }


register(Family("gpt_neox", ("gpt_neox",), _neox_spec, _neox_layer, _neox_globals))
