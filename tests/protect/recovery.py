"""What an attacker who holds the key gets back with the standard tools: the protected model is
opened, and ONNX Runtime's optimizer (BASIC, EXTENDED, ALL; its optimized graph saved with
``optimized_model_filepath``), the ONNX inliner, onnxsim and onnxslim are run on it; then every
tensor in each result is compared with every original weight (``chance_threshold``), the op
types counted, and the original names searched for.

ONNX Runtime runs on the model as it is opened, the run-time values given (initializers that are
also inputs, what the runtime feeds); the inliner, onnxsim and onnxslim on the model as the
library decrypts it, the run-time values being no part of it (a folder given them as constants
could fold what they feed; see docs/protect.md for what that gives and what it does not).

The statistic is Spearman's rank correlation: a weight that comes back (as it is, scaled,
shifted or negated) ranks at |r| = 1 as with Pearson's r, but chance is the same for any values:
for two independent tensors of ``n`` elements r is close to normal with standard deviation
``1/sqrt(n - 1)`` whatever their distribution. (Pearson's r is not: a few large entries, as a
32-channel bias or variance has, meeting at one index make it large by chance.) So the largest
|r| over ``pairs`` comparisons stays under ``z / sqrt(n - 1)`` with probability ``1 - alpha``,
``z`` the normal quantile of ``1 - alpha / (2 pairs)`` (Bonferroni), where ``pairs`` counts every
comparison of the check: each weight in each axis order against each tensor of its size, in
each tool's result (``family``). ``alpha = 1e-3``.
"""

from __future__ import annotations

import math
import tempfile
from collections import Counter
from pathlib import Path
from statistics import NormalDist

import numpy as np
import onnx
import onnx.inliner
from onnx import numpy_helper

from modelpress.ir import model_bytes, to_proto
from modelpress.protect.correlation import standardized, views
from modelpress.runtime.ort import session_options

ALPHA = 1e-3
MIN_ELEMENTS = 16  # below this, chance alone correlates tensors near 1: nothing to measure


def chance_threshold(n: int, pairs: int, alpha: float = ALPHA) -> float:
    z = NormalDist().inv_cdf(1 - alpha / (2 * max(pairs, 1)))
    return min(1.0, z / math.sqrt(max(n - 1, 1)))


def _without_runtime_values(model) -> onnx.ModelProto:
    """The opened model's proto with the run-time values left out (inputs without a value)."""
    proto = to_proto(model)
    inputs = {i.name for i in proto.graph.input}
    kept = [t for t in proto.graph.initializer if t.name not in inputs]
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(kept)
    return proto


def tool_results(opened) -> dict[str, onnx.ModelProto]:
    """Each tool's output on the opened model (an onnx_ir.Model from ``open_package``)."""
    import onnxruntime as ort
    import onnxsim
    import onnxslim

    out: dict[str, onnx.ModelProto] = {}
    levels = {
        "ort-basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "ort-extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "ort-all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    data = model_bytes(opened)
    with tempfile.TemporaryDirectory() as tmp:
        for name, level in levels.items():
            so = session_options()  # this process's thread settings
            so.graph_optimization_level = level
            so.optimized_model_filepath = str(Path(tmp) / f"{name}.onnx")
            ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
            out[name] = onnx.load(so.optimized_model_filepath)
    inlined = onnx.inliner.inline_local_functions(_without_runtime_values(opened))
    out["inliner"] = inlined
    simplified, _ = onnxsim.simplify(inlined, check_n=0)
    out["onnxsim"] = simplified
    out["onnxslim"] = onnxslim.slim(inlined)
    return out


def _all_tensors(proto: onnx.ModelProto) -> list[np.ndarray]:
    found = []

    def graph(g) -> None:
        for t in g.initializer:
            found.append(numpy_helper.to_array(t))
        for node in g.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    found.append(numpy_helper.to_array(a.t))
                elif a.type == onnx.AttributeProto.GRAPH:
                    graph(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for sub in a.graphs:
                        graph(sub)

    graph(proto.graph)
    for f in proto.functions:
        for node in f.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    found.append(numpy_helper.to_array(a.t))
    return [
        a.astype(np.float64)
        for a in found
        if a.dtype.kind in "fiub" and a.size >= MIN_ELEMENTS and a.dtype != np.bool_
    ]


def _ranks(arrays: list[np.ndarray]) -> list[np.ndarray]:
    from scipy.stats import rankdata

    return [rankdata(a.reshape(-1)) for a in arrays]  # ties share their mean rank


def worst_correlation(
    weights: list[np.ndarray], proto: onnx.ModelProto, *, family: int = 1
) -> dict:
    """The original weight whose rank correlation with a tensor of ``proto`` (any layout of the
    weight) is furthest above the chance threshold for its size, Bonferroni over every pair
    compared here times ``family`` (the results one check compares the weights with)."""
    found = _all_tensors(proto)
    scored = []
    for w in weights:
        same = [a for a in found if a.size == w.size]
        if not same:
            continue
        layouts = standardized(_ranks(views(w)))
        got = standardized(_ranks(same))
        r = float(np.abs(got @ layouts.T).max())
        scored.append((r, int(w.size), len(same) * len(layouts)))
    pairs = family * sum(p for *_, p in scored)
    worst = {"r": 0.0, "threshold": 1.0, "n": 0, "margin": -1.0}
    for r, n, _ in scored:
        threshold = chance_threshold(n, pairs)
        if r - threshold > worst["margin"]:
            worst = {"r": r, "threshold": threshold, "n": n, "margin": r - threshold}
    return worst


def op_counts(proto: onnx.ModelProto) -> Counter:
    counts: Counter = Counter()

    def graph(g) -> None:
        for node in g.node:
            counts[(node.domain or "", node.op_type)] += 1
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    graph(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for sub in a.graphs:
                        graph(sub)

    graph(proto.graph)
    for f in proto.functions:
        for node in f.node:
            counts[(node.domain or "", node.op_type)] += 1
    counts.pop(("", "Constant"), None)
    return counts


def same_count_share(original: onnx.ModelProto, result: onnx.ModelProto) -> float:
    """The share of the original's op types found in ``result`` at exactly their original count."""
    a, b = op_counts(original), op_counts(result)
    return sum(1 for t, c in a.items() if b.get(t) == c) / max(len(a), 1)


def original_weights(original: onnx.ModelProto) -> list[np.ndarray]:
    """Every float (or 8/16/32-bit integer) constant of ``MIN_ELEMENTS`` or more: the weights."""
    return [a for a in _all_tensors(original) if a.size >= MIN_ELEMENTS]
