"""A model with If and Loop subgraphs and a dynamic batch dimension, written in ONNX text.

    h     = x @ W + b
    y     = If(sum(h) > 0): Relu(h) else Sigmoid(h)
    z     = Loop 3 times: acc = Tanh(acc @ W2 + b2) + i        (acc starts at x)
    trace = the per-iteration ReduceSum(acc, axis=1), stacked      (a Loop scan output)

The subgraphs read outer-scope values (``h``, ``W2``, ``b2``) and contain the kind of redundancy
an optimizer should remove inside them (a Transpose pair, an Identity, a multiplication by one),
so a pass that recurses into subgraphs has work there, and one that breaks them fails verification.
There is no PyTorch source: tests compare it against the formula above.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper

FEATURES = 16
TRIPS = 3
SEED = 0

_TEXT = f"""
<ir_version: 8, opset_import: ["" : 17]>
control_flow (float[batch, {FEATURES}] x) => (float[batch, {FEATURES}] y, float[batch, {FEATURES}] z, float[{TRIPS}, batch] trace)
{{
    xw = MatMul(x, W)
    h = Add(xw, b)
    total = ReduceSum <keepdims = 0> (h)
    zero = Constant <value = float {{0.0}}> ()
    positive = Greater(total, zero)
    y = If (positive) <
        then_branch = then_graph () => (float[batch, {FEATURES}] then_out) {{
            t1 = Transpose <perm = [1, 0]> (h)
            t2 = Transpose <perm = [1, 0]> (t1)
            r = Relu(t2)
            then_out = Identity(r)
        }},
        else_branch = else_graph () => (float[batch, {FEATURES}] else_out) {{
            one = Constant <value = float {{1.0}}> ()
            s = Sigmoid(h)
            else_out = Mul(s, one)
        }}
    >
    trips = Constant <value = int64 {{{TRIPS}}}> ()
    keep_going = Constant <value = bool {{1}}> ()
    z, trace = Loop (trips, keep_going, x) <
        body = loop_body (int64 i, bool cond_in, float[batch, {FEATURES}] acc) => (bool cond_out, float[batch, {FEATURES}] acc_out, float[batch] row_sum) {{
            cond_out = Identity(cond_in)
            aw = MatMul(acc, W2)
            pre = Add(aw, b2)
            act = Tanh(pre)
            fi = Cast <to = 1> (i)
            acc_out = Add(act, fi)
            row_sum = ReduceSum <keepdims = 0> (acc_out, one_axis)
        }}
    >
}}
"""


def weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    scale = 1.0 / np.sqrt(FEATURES)
    return {
        "W": (rng.standard_normal((FEATURES, FEATURES)) * scale).astype(np.float32),
        "b": (rng.standard_normal(FEATURES) * 0.1).astype(np.float32),
        "W2": (rng.standard_normal((FEATURES, FEATURES)) * scale).astype(np.float32),
        "b2": (rng.standard_normal(FEATURES) * 0.1).astype(np.float32),
        "one_axis": np.array([1], dtype=np.int64),
    }


def build_proto() -> onnx.ModelProto:
    proto = onnx.parser.parse_model(_TEXT)
    for name, value in weights().items():
        proto.graph.initializer.append(onnx.numpy_helper.from_array(value, name))
    return proto


def sample_inputs(batch: int, *, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, FEATURES)).astype(np.float32)}
