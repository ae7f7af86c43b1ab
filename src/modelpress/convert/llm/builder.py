"""Write the decoder's ONNX graph from a ``Spec`` and its weights, with standard ONNX ops (opset 23).

The interface is ``modelpress.ir.llm``'s: ``input_ids``, ``attention_mask``, ``position_ids`` and
``past_key_values.{i}.key|value`` in; ``logits`` and ``present.{i}.key|value`` out, with
``kv_layout="in_place"``: each row's entries are its first columns, the past is as wide as the
mask (it has the step's room), and a step writes its new keys and values into the past at the
row's next columns (``ScatterND``); the present is that past. A driver that binds the
present to the past's own buffer has the step write its few entries in place (ONNX Runtime's
ScatterND skips the copy when its input and output are one buffer), and a row's entries sit
at the same columns whatever the batch, so its logits are those it gets alone, bit for bit.

Which key a query sees (one float bias per kind of layer, computed once and shared): row ``b``'s
step starts at column ``n_b = max(ones(mask[b]) - seq, 0)`` (0 for a prompt, whose padded rows
have fewer ones than tokens), its token ``s`` sits at column ``n_b + s`` and sees key column
``t`` iff ``t <= n_b + s`` and ``attention_mask[b, t] == 1``; on a sliding-window layer also
``n_b + s - t < window`` (a column is a position). Rope angles come from ``position_ids`` as given.

Weights the int4 pass may replace, each the ``B`` of a ``MatMul(x, B)`` stored ``[in, out]``:

``model.layers.{i}.self_attn.qkv_proj.MatMul.weight``  q, k and v side by side
``model.layers.{i}.self_attn.o_proj.MatMul.weight``
``model.layers.{i}.mlp.gate_up_proj.MatMul.weight``    gate and up side by side (gated MLPs)
``model.layers.{i}.mlp.up_proj.MatMul.weight``         (MLPs without a gate: GPT-2, NeoX)
``model.layers.{i}.mlp.down_proj.MatMul.weight``
``lm_head.MatMul.weight``                              ``[hidden, vocab]`` (a copy when tied)

Biases are ``<same prefix>.bias`` and added after the MatMul; the embedding is
``model.embed_tokens.weight`` ``[vocab, hidden]`` (Gather). Gemma's ``sqrt(hidden)`` is folded into
the embedding table and its ``1 + w`` into the norm weights.

Per layer: ``RMSNormalization`` (or ``LayerNormalization``), one MatMul for q|k|v, ``Split``,
``RotaryEmbedding`` on q and on k (cos/sin computed once per forward from ``position_ids``, so
any position and Phi-3's long factors work without a table), k and v written into the cache
(``ScatterND``), ONNX's ``Attention`` on the whole cache (the queries of each kv head
grouped as one head's rows, the scale, Gemma 2's soft-capping before the mask, and the shared
mask as a float bias), the o MatMul, one
MatMul for gate|up, SiLU as ``x*Sigmoid(x)``, the down MatMul: about 25 nodes a layer.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from modelpress.convert.llm.families import Spec
from modelpress.convert.llm.graph import (
    MASKED,
    MS,
    OPSET,
    Graph,
    head_norms,
    linear,
    norm,
    qkv_projection,
)
from modelpress.convert.llm.rope import Rope
from modelpress.ir.llm import (
    ATTENTION_MASK,
    INPUT_IDS,
    KEEP_ALL,
    LOGITS,
    LOGITS_TO_KEEP,
    POSITION_IDS,
    past_names,
    present_names,
)


def _activation(g: Graph, spec: Spec, x: str, name: str) -> str:
    if spec.activation == "silu":
        return g.op("Mul", [x, g.op("Sigmoid", [x], name=f"{name}/Sigmoid")], name=f"{name}/Mul")
    approximate = "tanh" if spec.activation == "gelu_tanh" else "none"
    return g.op("Gelu", [x], name=f"{name}/Gelu", approximate=approximate)


def _softcap(g: Graph, x: str, cap: float, name: str) -> str:
    y = g.op("Mul", [x, g.const(1.0 / cap, np.float32)], name=f"{name}/Div")
    y = g.op("Tanh", [y], name=f"{name}/Tanh")
    return g.op("Mul", [y, g.const(cap, np.float32)], name=f"{name}/Mul")


class _Shared:
    """What every layer reads: where the step's entries go, the attention bias per kind of layer,
    rope cos/sin per rope."""

    def __init__(self, g: Graph, spec: Spec):
        self.g, self.spec = g, spec
        self._bias: dict[bool, str] = {}
        self._rope: dict[tuple, tuple[str, str]] = {}
        mask = ATTENTION_MASK
        zero, one, scalar = g.const(0), g.const(1), g.const([0])
        batch = g.op("Shape", [INPUT_IDS], name="kv/batch", start=0, end=1)  # [1]
        seq = g.op("Shape", [INPUT_IDS], name="kv/seq", start=1, end=2)  # [1]
        total = g.op("Shape", [mask], name="kv/total", start=1, end=2)  # [1]: the cache's width
        # n_b: the row's entries before this step (its ones, less the step's own; 0 for a
        # prompt, whose padded rows have fewer ones than tokens)
        ones = g.op("ReduceSum", [mask, g.const([1])], name="kv/ones", keepdims=1)  # [B, 1]
        start = g.op("Max", [g.op("Sub", [ones, seq], name="kv/sub"), zero], name="kv/start")
        steps = g.op(
            "Range", [zero, g.op("Squeeze", [seq, scalar], name="kv/seq0"), one], name="kv/steps"
        )
        self.columns = g.op("Add", [start, steps], name="kv/columns")  # [B, S]: where they go
        # ScatterND's indices [B, S, kv_heads, 3]: (row, head, column) of each written vector,
        # in the order of the step's keys as they come ([B, S, kv_heads, head_dim]: no Transpose)
        shape = g.op(
            "Concat", [batch, seq, g.const([spec.num_kv_heads, 1])], name="kv/shape", axis=0
        )
        rows = g.op(
            "Range",
            [zero, g.op("Squeeze", [batch, scalar], name="kv/batch0"), one],
            name="kv/rows",
        )
        parts = [
            g.op("Unsqueeze", [rows, g.const([1, 2, 3])], name="kv/row4"),
            g.const(np.arange(spec.num_kv_heads, dtype=np.int64).reshape(1, 1, -1, 1)),
            g.op("Unsqueeze", [self.columns, g.const([2, 3])], name="kv/col4"),
        ]
        self.index = g.op(
            "Concat",
            [g.op("Expand", [x, shape], name=f"kv/index{j}") for j, x in enumerate(parts)],
            name="kv/index",
            axis=3,
        )
        keys = g.op(
            "Range", [zero, g.op("Squeeze", [total, scalar], name="kv/total0"), one], name="kv/t"
        )  # [T]
        query = g.op("Unsqueeze", [self.columns, g.const([2])], name="kv/query")  # [B, S, 1]
        causal = g.op("LessOrEqual", [keys, query], name="mask/causal")  # [B, S, T]
        real = g.op("Cast", [mask], name="mask/bool", to=TensorProto.BOOL)
        real = g.op("Unsqueeze", [real, g.const([1])], name="mask/b1t")  # [B, 1, T]
        visible = g.op("And", [causal, real], name="mask/visible")  # [B, S, T]
        self.visible = g.op(
            "Unsqueeze", [visible, g.const([1])], name="mask/visible4"
        )  # [B, 1, S, T]
        if any(spec.sliding):
            # a key's position is its column (rows are left-aligned): the query sees the keys
            # fewer than ``window`` positions back, itself included
            distance = g.op("Sub", [query, keys], name="mask/distance")  # [B, S, T]
            near = g.op("Less", [distance, g.const(spec.sliding_window)], name="mask/near")
            near = g.op("Unsqueeze", [near, g.const([1])], name="mask/near4")
            self.visible_local = g.op("And", [self.visible, near], name="mask/visible_local")

    def bias(self, local: bool, groups: int = 1) -> str:
        """``[B, 1, groups*S, T]`` float: 0 where visible, the float32 minimum elsewhere (the
        ``[S, T]`` rows repeated ``groups`` times, for queries grouped by their kv head)."""
        key = (local, groups)
        if key not in self._bias:
            g = self.g
            tag = f"mask/{'local' if local else 'global'}"
            if groups > 1:
                self._bias[key] = g.op(
                    "Tile",
                    [self.bias(local), g.const([1, 1, groups, 1])],
                    name=f"{tag}/bias_x{groups}",
                )
                return self._bias[key]
            visible = self.visible_local if local else self.visible
            bias = g.op(
                "Where",
                [visible, g.const(0.0, np.float32), g.const(MASKED, np.float32)],
                name=f"{tag}/bias",
            )
            self._bias[key] = bias
        return self._bias[key]

    def rope(self, rope: Rope) -> tuple[str, str]:
        """``cos``, ``sin`` ``[B, S, rotary_dim/2]`` of ``rope`` at ``position_ids``."""
        key = rope.key()
        if key not in self._rope:
            g = self.g
            tag = f"rope{len(self._rope)}"
            pos = g.op("Cast", [POSITION_IDS], name=f"{tag}/pos", to=TensorProto.FLOAT)
            pos = g.op("Unsqueeze", [pos, g.const([2])], name=f"{tag}/pos3")  # [B, S, 1]
            inv = g.init(f"{tag}.inv_freq", rope.inv_freq)
            if rope.long_inv_freq is not None:
                longest = g.op("ReduceMax", [POSITION_IDS], name=f"{tag}/longest", keepdims=0)
                use_long = g.op(
                    "GreaterOrEqual", [longest, g.const(rope.long_from)], name=f"{tag}/long"
                )
                inv = g.op(
                    "Where",
                    [use_long, g.init(f"{tag}.long_inv_freq", rope.long_inv_freq), inv],
                    name=f"{tag}/inv_freq",
                )
            freqs = g.op("Mul", [pos, inv], name=f"{tag}/freqs")  # [B, S, rotary_dim/2]
            cos = g.op("Cos", [freqs], name=f"{tag}/cos")
            sin = g.op("Sin", [freqs], name=f"{tag}/sin")
            if rope.attention_scaling != 1.0:
                s = g.const(rope.attention_scaling, np.float32)
                cos = g.op("Mul", [cos, s], name=f"{tag}/cos_scaled")
                sin = g.op("Mul", [sin, s], name=f"{tag}/sin_scaled")
            self._rope[key] = (cos, sin)
        return self._rope[key]

    def attention(self, g: Graph, spec: Spec, x: str, w: dict, i: int) -> str:
        return _attention(g, spec, self, x, w, i)


def _rotate(g: Graph, spec: Spec, x: str, heads: int, cos: str, sin: str, name: str) -> str:
    """ONNX's RotaryEmbedding on ``x`` ``[B, S, heads*head_dim]`` (its first ``rotary_dim`` dims of
    each head), with this step's ``cos``/``sin`` ``[B, S, rotary_dim/2]``."""
    attrs = {"num_heads": heads}
    if spec.rotary_dim != spec.head_dim:
        attrs["rotary_embedding_dim"] = spec.rotary_dim
    return g.op("RotaryEmbedding", [x, cos, sin], name=name, **attrs)


def _heads(g: Graph, x: str, heads: int, d: int, name: str) -> str:
    """``[B, S, heads*d]`` as ``[B, heads, S, d]``."""
    x = g.op("Reshape", [x, g.const([0, 0, heads, d])], name=f"{name}/Reshape")
    return g.op("Transpose", [x], name=f"{name}/Transpose", perm=[0, 2, 1, 3])


def _attention(g: Graph, spec: Spec, shared: _Shared, x: str, w: dict, i: int) -> str:
    p = f"model.layers.{i}.self_attn"
    nh, kvh, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    sizes = (nh * d, kvh * d, kvh * d)
    qkv = qkv_projection(g, x, p, w, sizes)
    q, k, v = g.op("Split", [qkv, g.const(list(sizes))], name=f"{p}/split", axis=-1, outputs=3)
    if spec.qk_norm:
        q, k = head_norms(g, spec, q, k, w, p)
    if spec.positions == "rope":
        cos, sin = shared.rope(spec.rope[i])
        q = _rotate(g, spec, q, nh, cos, sin, f"{p}/q_rope")
        k = _rotate(g, spec, k, kvh, cos, sin, f"{p}/k_rope")
    local = bool(spec.sliding and spec.sliding[i])
    # the step's keys and values written into the past at each row's columns: the present is the
    # past with them (``kv_layout`` ``in_place``), one buffer when the driver binds both to it
    present = []
    for new, past, out in zip((k, v), past_names(i), present_names(i)):
        tag = out.rsplit(".", 1)[1]
        new = g.op("Reshape", [new, g.const([0, 0, kvh, d])], name=f"{p}/{tag}_heads/Reshape")
        g.nodes.append(
            helper.make_node(
                "ScatterND",
                [past, shared.index, new],
                [out],
                name=f"{p}/{tag}_write",
            )
        )
        present.append(out)
    # queries grouped by their kv head: [B, kvh, G*S, d] (head h reads kv head h // G), so that
    # Attention runs as kvh plain heads: ONNX Runtime's grouped-query path took 52 us where the
    # same work as plain heads takes 34 (SmolLM2's 9/3 heads, 272 columns, one thread)
    groups = nh // kvh
    attrs = {"q_num_heads": kvh, "kv_num_heads": kvh, "scale": float(spec.scale)}
    if spec.attn_softcap:
        attrs["softcap"] = float(spec.attn_softcap)  # applied before the mask, as in Gemma 2
    if groups > 1:
        q = g.op("Reshape", [q, g.const([0, 0, kvh, groups, d])], name=f"{p}/q_groups")
        q = g.op("Transpose", [q], name=f"{p}/q_groups/Transpose", perm=[0, 2, 3, 1, 4])
        q = g.op("Reshape", [q, g.const([0, kvh, -1, d])], name=f"{p}/q_grouped")
    else:
        q = _heads(g, q, nh, d, f"{p}/q_heads")
    y = g.op(
        "Attention", [q, *present, shared.bias(local, groups)], name=f"{p}/attention", **attrs
    )  # [B, kvh, G*S, d]
    if groups > 1:
        y = g.op("Reshape", [y, g.const([0, kvh, groups, -1, d])], name=f"{p}/attention/groups")
        y = g.op("Transpose", [y], name=f"{p}/attention/Transpose", perm=[0, 3, 1, 2, 4])
    else:
        y = g.op("Transpose", [y], name=f"{p}/attention/Transpose", perm=[0, 2, 1, 3])
    y = g.op("Reshape", [y, g.const([0, 0, nh * d])], name=f"{p}/attention/Reshape")
    return linear(g, y, f"{p}.o_proj", w["o"], w.get("o_bias"))


def _mlp(g: Graph, spec: Spec, x: str, w: dict, i: int) -> str:
    p = f"model.layers.{i}.mlp"
    if spec.gated_mlp:
        inter = w["gate"].shape[0]
        weight = np.concatenate([w["gate"], w["up"]], axis=0)
        bias = None
        if "gate_bias" in w or "up_bias" in w:
            zeros = np.zeros(inter, np.float32)
            bias = np.concatenate([w.get("gate_bias", zeros), w.get("up_bias", zeros)])
        gu = linear(g, x, f"{p}.gate_up_proj", weight, bias)
        gate, up = g.op(
            "Split", [gu, g.const([inter, inter])], name=f"{p}/split", axis=-1, outputs=2
        )
        h = g.op("Mul", [_activation(g, spec, gate, f"{p}/act"), up], name=f"{p}/gated")
    else:
        h = _activation(
            g, spec, linear(g, x, f"{p}.up_proj", w["up"], w.get("up_bias")), f"{p}/act"
        )
    return linear(g, h, f"{p}.down_proj", w["down"], w.get("down_bias"))


class _Stream:
    """The residual stream: ``x`` plus a branch output not yet added (``pending``), so that the
    add and the next norm can be one node at the ``ort`` level (Skip*LayerNormalization)."""

    def __init__(self, g: Graph, spec: Spec, x: str, fused: bool):
        self.g, self.spec, self.x, self.fused = g, spec, x, fused
        self.pending: str | None = None

    def norm(self, name: str, w: np.ndarray, b: np.ndarray | None, *, last: bool = False) -> str:
        """The norm of the stream after adding what is pending (``last``: the final norm, whose
        sum nothing reads: the fused node leaves that output out)."""
        g, spec = self.g, self.spec
        if self.pending is None:
            return norm(g, spec, self.x, name, w, b)
        if not self.fused:
            self.x = g.op("Add", [self.x, self.pending], name=f"{name}/residual")
            self.pending = None
            return norm(g, spec, self.x, name, w, b)
        weight = g.init(f"{name}.weight", (w + np.float32(spec.norm_offset)).astype(np.float32))
        if spec.norm == "rms":
            op, inputs = "SkipSimplifiedLayerNormalization", [self.pending, self.x, weight]
        else:
            beta = g.init(f"{name}.bias", b if b is not None else np.zeros_like(w))
            op, inputs = "SkipLayerNormalization", [self.pending, self.x, weight, beta]
        h, self.x = f"{name}/out", f"{name}/residual"
        outputs = [h] if last else [h, "", "", self.x]
        g.nodes.append(
            helper.make_node(op, inputs, outputs, name=name, domain=MS, epsilon=spec.norm_eps)
        )
        self.pending = None
        return h

    def add(self, branch: str, name: str) -> None:
        if self.pending is not None:
            self.x = self.g.op("Add", [self.x, self.pending], name=f"{name}/residual")
        self.pending = branch


def _layer(g: Graph, spec: Spec, shared, stream: _Stream, w: dict, i: int) -> None:
    p = f"model.layers.{i}"
    h = stream.norm(f"{p}.input_layernorm", w["attn_norm"], w.get("attn_norm_bias"))
    attn = shared.attention(g, spec, h, w, i)
    if spec.parallel_residual:  # x + attn(ln1 x) + mlp(ln2 x): ln2 reads the same x
        h2 = norm(
            g,
            spec,
            stream.x,
            f"{p}.post_attention_layernorm",
            w["mlp_norm"],
            w.get("mlp_norm_bias"),
        )
        mlp = _mlp(g, spec, h2, w, i)
        stream.add(g.op("Add", [attn, mlp], name=f"{p}/branches"), p)
        return
    if spec.sandwich_norms:
        attn = norm(g, spec, attn, f"{p}.post_attention_layernorm", w["post_attn_norm"], None)
    stream.add(attn, f"{p}/attn")
    name = (
        f"{p}.pre_feedforward_layernorm" if spec.sandwich_norms else f"{p}.post_attention_layernorm"
    )
    h = stream.norm(name, w["mlp_norm"], w.get("mlp_norm_bias"))
    mlp = _mlp(g, spec, h, w, i)
    if spec.sandwich_norms:
        mlp = norm(g, spec, mlp, f"{p}.post_feedforward_layernorm", w["post_mlp_norm"], None)
    stream.add(mlp, f"{p}/mlp")


def _last_positions(g: Graph, x: str) -> str:
    """``x[:, -logits_to_keep:]``: the positions the LM head runs on (``ir.llm``: all of them
    unless the driver feeds a smaller ``logits_to_keep``)."""
    # the input's default (a scalar: Graph.init would store it as [1])
    g.inits.append(numpy_helper.from_array(np.array(KEEP_ALL, np.int64), LOGITS_TO_KEEP))
    start = g.op(
        "Neg",
        [g.op("Reshape", [LOGITS_TO_KEEP, g.const([1])], name="keep/Reshape")],
        name="keep/Neg",
    )
    return g.op("Slice", [x, start, g.const([KEEP_ALL]), g.const([1])], name="keep/Slice")


def build_decoder(
    spec: Spec, globals_: dict, layer_weights, *, level: str = "standard"
) -> onnx.ModelProto:
    """The decoder graph. ``layer_weights(i)`` hands layer ``i``'s canonical weights (one layer
    at a time, so a large checkpoint is never held twice). ``level``: ``standard`` (ONNX ops,
    ``kv_layout`` ``in_place``) or ``ort`` (ONNX Runtime's contrib ops, ``kv_layout``
    ``left_aligned``: see ``ort_level``)."""
    g = Graph()
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    inputs = [
        helper.make_tensor_value_info(INPUT_IDS, i64, ["batch", "seq"]),
        helper.make_tensor_value_info(ATTENTION_MASK, i64, ["batch", "total"]),
        helper.make_tensor_value_info(POSITION_IDS, i64, ["batch", "seq"]),
    ]
    outputs = [helper.make_tensor_value_info(LOGITS, f32, ["batch", "seq", spec.vocab_size])]
    kv = ["batch", spec.num_kv_heads]
    past = "past" if level == "ort" else "total"  # ``in_place``: the past has the step's room
    for i in range(spec.num_layers):
        for name in past_names(i):
            inputs.append(helper.make_tensor_value_info(name, f32, [*kv, past, spec.head_dim]))
        for name in present_names(i):
            outputs.append(helper.make_tensor_value_info(name, f32, [*kv, "total", spec.head_dim]))

    embed = globals_["embed"]
    table = embed * np.float32(spec.embed_scale) if spec.embed_scale else embed
    x = g.op("Gather", [g.init("model.embed_tokens.weight", table), INPUT_IDS], name="embed")
    if spec.positions == "learned":
        wpe = g.init("model.embed_positions.weight", globals_["positions"])
        x = g.op(
            "Add", [x, g.op("Gather", [wpe, POSITION_IDS], name="embed_pos")], name="embed_sum"
        )
    if level == "ort":
        from modelpress.convert.llm.ort_level import OrtShared

        shared = OrtShared(g, spec)
    else:
        shared = _Shared(g, spec)
    stream = _Stream(g, spec, x, fused=level == "ort")
    for i in range(spec.num_layers):
        _layer(g, spec, shared, stream, layer_weights(i), i)
    x = stream.norm(
        "model.norm", globals_["final_norm"], globals_.get("final_norm_bias"), last=True
    )
    inputs.append(helper.make_tensor_value_info(LOGITS_TO_KEEP, i64, []))
    x = _last_positions(g, x)
    if spec.final_softcap:
        logits = linear(g, x, "lm_head", globals_["lm_head"], globals_.get("lm_head_bias"))
        logits = _softcap(g, logits, spec.final_softcap, "lm_head/softcap")
        g.nodes.append(helper.make_node("Identity", [logits], [LOGITS], name="logits"))
    else:
        logits = linear(g, x, "lm_head", globals_["lm_head"], globals_.get("lm_head_bias"))
        g.nodes.append(helper.make_node("Identity", [logits], [LOGITS], name="logits"))
    graph = helper.make_graph(g.nodes, f"{spec.family}_decoder", inputs, outputs, g.inits)
    opsets = [helper.make_opsetid("", OPSET)]
    if level == "ort":
        opsets.append(helper.make_opsetid(MS, 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="modelpress")
    model.ir_version = 10
    return model
