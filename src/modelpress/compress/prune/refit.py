"""Least-squares refit of the layers that read pruned neurons and heads, before they are removed.

A reader ``y = a W + b`` (``calibration.Reader``) loses the rows of ``W`` of its removed units. On
the calibration tokens that reach the outputs, its kept rows and its bias become the ridge
least-squares solution of

    min ‖[a_k, 1] [W_k'; δb] − a W‖²  +  λ ‖[W_k'; δb]‖²

so the part of the removed units' contribution that the kept units and a constant can explain (a
neuron that copies another, the mean output of the removed ones) moves into the kept weights and
the bias: the one-shot, layer-wise reconstruction of post-training pruning (Kwon et al. 2022;
FLAP, An et al. 2024, for the bias). Only the Gram matrix ``G = [a, 1]ᵀ[a, 1]`` of the original
model's activations is needed: ``[W_k'; δb] = (G_kk + λI)⁻¹ G_k: [W; 0]``, with ``λ`` ``damping``
times the mean diagonal of ``G_kk``. (Refitting each layer on the inputs of the model pruned so
far, in graph order, measured no better on MiniLM and costs a pass over the data per layer.) A
reader whose bias cannot be found (no constant Add of its own after it) is refit without one; a
Gemm reader, or a weight shared with other nodes, is left as it is.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.compress.prune import importance as imp
from modelpress.compress.prune.calibration import Reader
from modelpress.compress.prune.depgraph import DepGraph

DAMPING = 1e-3
# the order only needs H invertible: a larger ridge makes removing a dead unit look costly
ORDER_DAMPING = 1e-6


def refit(dg: DepGraph, found: list[Reader], removed: set, *, damping: float = DAMPING) -> int:
    """Refit, in ``dg.model``, every reader that loses units (``found`` observed by
    ``calibration.observe``); returns how many were refit."""
    done = 0
    for r in found:
        gone = {u for u in range(r.track.units) if dg.uf.find((r.value, u)) in removed}
        node = r.slice.node
        weight = _sole_initializer(node.inputs[1])
        if not gone or r.tokens == 0 or weight is None or node.op_type != "MatMul":
            continue
        bias = _bias(node, r.weight.shape[1])
        rows = r.slice.indices([u for u in range(r.track.units) if u not in gone])
        cols = np.append(rows, r.track.size) if bias is not None else rows
        gram = r.gram[np.ix_(cols, cols)]
        ridge = damping * float(np.mean(np.diag(gram)))
        solved = np.linalg.solve(
            gram + ridge * np.eye(len(cols)), r.gram[cols, : r.track.size] @ r.weight
        )
        new_w = r.weight.copy()
        new_w[rows] = solved[: len(rows)]
        _set(weight, new_w)  # the removed rows go with the surgery
        if bias is not None:
            _set(bias, bias.const_value.numpy().astype(np.float64) + solved[-1])
        done += 1
    return done


def obs_scores(dg: DepGraph, found: list[Reader], *, damping: float = ORDER_DAMPING) -> dict:
    """Component id → the squared error greedy removal has added to its reader's output (summed over
    the calibration tokens) when it takes the component, for the components with a reader (a unit
    read by several layers: the largest); others keep their ``l1`` score (see ``removal_order``).
    Within a reader the scores rise in removal order. Across readers they compare where the
    readers' outputs share a scale, as the sub-layers of a transformer adding into one normalized
    residual stream do: so a global ranking takes more units where the refit recovers more."""
    out = imp.scores(dg, "l1")
    measured: dict = {}
    for r in found:
        order, errors = removal_order(r, damping=damping)
        for u, e in zip(order, np.cumsum(errors)):
            c = dg.uf.find((r.value, u))
            measured[c] = max(measured.get(c, 0.0), float(e))
    out.update(measured)
    return out


def removal_order(r: Reader, *, damping: float = ORDER_DAMPING) -> tuple[list[int], list[float]]:
    """The reader's units in the order greedy removal takes them, and the error each removal adds
    (the last unit, never removed: infinite). Each is the one whose removal,
    with the refit of the rest, adds the least error (Optimal Brain Surgeon for a block of rows:
    the error of removing rows ``B`` is ``tr(W_Bᵀ (H⁻¹_BB)⁻¹ W_B)`` with ``H`` the damped Gram
    matrix; after each removal ``W`` takes the compensating update and ``H⁻¹`` loses the rows,
    Frantar & Alistarh 2022). The constant column (the bias) is never removed."""
    n, block = r.track.size, r.track.block
    h = r.gram + damping * float(np.mean(np.diag(r.gram))) * np.eye(n + 1)
    hinv = np.linalg.inv(h)
    w = np.vstack([r.weight, np.zeros((1, r.weight.shape[1]))])
    left = list(range(r.track.units))
    order, added = [], []
    while len(left) > 1:
        rows = np.asarray(left)[:, None] * block + np.arange(block)  # (units left, block)
        wb = w[rows]
        errors = np.einsum(
            "kbo,kbo->k", wb, np.linalg.solve(hinv[rows[:, :, None], rows[:, None, :]], wb)
        )
        best = int(np.argmin(errors))
        u = left.pop(best)
        order.append(u)
        added.append(max(float(errors[best]), 0.0))
        b = slice(u * block, (u + 1) * block)
        step = hinv[:, b] @ np.linalg.inv(hinv[b, b])
        w -= step @ w[b]
        hinv -= step @ hinv[b, :]
        w[b] = 0.0
    return order + left, added + [np.inf] * len(left)


def _sole_initializer(value: ir.Value | None) -> ir.Value | None:
    if (
        value is None
        or not value.is_initializer()
        or len(value.uses()) != 1
        or value.const_value is None
    ):
        return None
    return value


def _bias(node: ir.Node, width: int) -> ir.Value | None:
    """The constant vector of ``width`` added to ``node``'s output, if that Add is its only reader."""
    uses = list(node.outputs[0].uses())
    if len(uses) != 1 or uses[0].node.op_type != "Add":
        return None
    b = _sole_initializer(uses[0].node.inputs[1 - uses[0].idx])
    if b is None or b.const_value.numpy().shape != (width,):
        return None
    return b


def _set(value: ir.Value, array: np.ndarray) -> None:
    dtype = value.const_value.numpy().dtype
    value.const_value = ir.tensor(np.ascontiguousarray(array.astype(dtype)), name=value.name)
