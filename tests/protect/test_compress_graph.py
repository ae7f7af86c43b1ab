"""Graph compression: a layer and its followers form one group (Conv+BN+Relu, MatMul+Add+GELU,
the attention core with its projection), and every partition is convex, so the contracted graph
stays acyclic, on crafted graphs and on random ones."""

from __future__ import annotations

import numpy as np
import pytest
from mp_testing import model_from_text

from modelpress.ir import load
from modelpress.protect.compress_graph import find_groups, reads


def _ops(groups):
    return [[n.op_type for n in g] for g in groups]


def test_a_residual_block_groups_by_layer():
    model = model_from_text(
        """<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 4, 8, 8] x) => (float[1, 4, 8, 8] y)
        <float[4, 4, 3, 3] w1 = {WEIGHTS}, float[4, 4, 3, 3] w2 = {WEIGHTS}, float[4] s = {1.0, 1.0, 1.0, 1.0},
         float[4] b = {0.0, 0.0, 0.0, 0.0}, float[4] m = {0.0, 0.0, 0.0, 0.0}, float[4] v = {1.0, 1.0, 1.0, 1.0}> {
            c1 = Conv <pads = [1, 1, 1, 1]> (x, w1)
            n1 = BatchNormalization(c1, s, b, m, v)
            r1 = Relu(n1)
            c2 = Conv <pads = [1, 1, 1, 1]> (r1, w2)
            n2 = BatchNormalization(c2, s, b, m, v)
            sum = Add(n2, r1)
            y = Relu(sum)
        }""".replace("WEIGHTS", ", ".join(["0.1"] * 144))
    )
    groups = find_groups(model.graph, np.random.default_rng(0))
    assert _ops(groups) == [
        ["Conv", "BatchNormalization", "Relu"],
        ["Conv", "BatchNormalization", "Add", "Relu"],
    ]


def test_matmul_bias_and_gelu_primitives_form_one_group():
    model = model_from_text(
        """<ir_version: 8, opset_import: ["" : 17]>
        g (float[2, 8] x) => (float[2, 8] y) <float[8, 8] w = {W}, float[8] b = {B}, float sq2 = {1.4142135}, float one = {1.0}, float half = {0.5}> {
            mm = MatMul(x, w)
            h = Add(mm, b)
            d = Div(h, sq2)
            e = Erf(d)
            p = Add(e, one)
            q = Mul(h, p)
            y = Mul(q, half)
        }""".replace("{W}", "{" + ", ".join(["0.1"] * 64) + "}").replace(
            "{B}", "{" + ", ".join(["0.0"] * 8) + "}"
        )
    )
    groups = find_groups(model.graph, np.random.default_rng(0))
    assert _ops(groups) == [["MatMul", "Add", "Div", "Erf", "Add", "Mul", "Mul"]]


def test_attention_scores_form_one_node(zoo_paths):
    """In bert-tiny the score MatMul (of two activations) is no anchor: QK^T, the scaling, the
    mask and the Softmax of each layer end up in one group."""
    model = load(zoo_paths["bert-tiny"])
    groups = find_groups(model.graph, np.random.default_rng(0))
    softmax_groups = [g for g in groups if any(n.op_type == "Softmax" for n in g)]
    assert len(softmax_groups) == 2  # two layers
    for g in softmax_groups:
        ops = [n.op_type for n in g]
        scores = [
            n for n in g if n.op_type == "MatMul" and all(v.const_value is None for v in n.inputs)
        ]
        assert scores and ops.index("Softmax") > g.index(scores[0])
        assert {"Div", "Add"} <= set(ops)
    assert sum(len(g) for g in groups) == sum(1 for n in model.graph if n.op_type != "Constant")


def _random_graph(rng: np.random.Generator, size: int):
    """A random DAG of elementwise ops and MatMuls with weights (anchors)."""
    lines, values = [], ["x"]
    inits = []
    for i in range(size):
        kind = rng.integers(4)
        a = values[int(rng.integers(len(values)))]
        if kind == 0:
            inits.append(f"float[4, 4] w{i} = {{{', '.join(['0.5'] * 16)}}}")
            lines.append(f"v{i} = MatMul({a}, w{i})")
        elif kind == 1:
            lines.append(f"v{i} = Relu({a})")
        else:
            b = values[int(rng.integers(len(values)))]
            lines.append(f"v{i} = {'Add' if kind == 2 else 'Mul'}({a}, {b})")
        values.append(f"v{i}")
    lines.append(f"y = Identity(v{size - 1})")
    text = (
        '<ir_version: 8, opset_import: ["" : 17]>\n'
        f"g (float[4, 4] x) => (float[4, 4] y) <{', '.join(inits) or 'float[1] unused = {0.0}'}> {{\n"
        + "\n".join(lines)
        + "\n}"
    )
    return model_from_text(text)


@pytest.mark.parametrize("seed", range(25))
def test_every_partition_is_convex(seed):
    rng = np.random.default_rng(seed)
    model = _random_graph(rng, 40)
    groups = find_groups(model.graph, rng)
    group_of = {n: i for i, g in enumerate(groups) for n in g}
    assert sorted(map(id, group_of)) == sorted(id(n) for n in model.graph)
    edges = {
        (group_of[v.producer()], group_of[n])
        for n in model.graph
        for v in reads(n)
        if v.producer() in group_of and group_of[v.producer()] != group_of[n]
    }
    # the contracted graph must have a topological order
    indegree = {g: 0 for g in range(len(groups))}
    for _, b in edges:
        indegree[b] += 1
    ready = [g for g, d in indegree.items() if d == 0]
    seen = 0
    while ready:
        g = ready.pop()
        seen += 1
        for a, b in edges:
            if a == g:
                indegree[b] -= 1
                if indegree[b] == 0:
                    ready.append(b)
    assert seen == len(groups), "a group is not convex: the contracted graph has a cycle"
