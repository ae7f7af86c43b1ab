"""Unstructured and 2:4 semi-structured pruning: zeros in the weights, by magnitude.

The weights pruned are those of Conv, ConvTranspose, Gemm and MatMul (a constant right operand of
rank 2 or more); biases, norms and embedding tables stay dense, and so do the layers the user keeps.

- ``unstructured``: the fraction ``sparsity`` of the smallest-magnitude weights become zero, ranked
  over all layers at once (``scope="global"``: large, redundant layers lose more, small sensitive
  ones less) or in each layer alone (``scope="layer"``);
- ``2:4``: in every run of 4 consecutive weights along the reduction axis (a Conv's input channels
  at each kernel position, a MatMul's or Gemm's K), the 2 smallest become zero: the pattern NVIDIA's
  sparse tensor cores (Ampere and later) run at up to twice the dense rate. Layers whose reduction
  length is not a multiple of 4 stay dense, and the result says which.

The zeros are kept through fine-tuning by a mask reparametrization (``mask_module``): the trained
weight is ``w ⊙ mask``, so gradients never revive a pruned weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from modelpress.errors import OptionError
from modelpress.ir.match import const_array

PATTERNS = ("unstructured", "2:4")
SCOPES = ("global", "layer")


@dataclass(frozen=True)
class Weight:
    """A prunable weight: the initializer's name and its reduction axis."""

    name: str
    axis: int
    nodes: tuple[str, ...]


def prunable_weights(model: ir.Model, *, keep: frozenset[str] = frozenset()) -> list[Weight]:
    """The weights pruning may zero, in graph order (each initializer once)."""
    found: dict[str, Weight] = {}
    kept: set[str] = set()
    for node in model.graph:
        if node.op_type not in ("Conv", "ConvTranspose", "Gemm", "MatMul") or len(node.inputs) < 2:
            continue
        w = node.inputs[1]
        if w is None or not w.is_initializer() or w.is_graph_input():
            continue
        array = w.const_value.numpy()
        if array.dtype.kind != "f" or array.ndim < 2:
            continue
        if node.name in keep:
            kept.add(w.name)
            continue
        if node.op_type == "Conv":
            axis = 1
        elif node.op_type == "ConvTranspose":
            axis = 0
        elif node.op_type == "Gemm":
            axis = (
                1
                if node.attributes.get("transB") is not None and node.attributes["transB"].value
                else 0
            )
        else:
            axis = array.ndim - 2
        prev = found.get(w.name)
        found[w.name] = Weight(w.name, axis, (prev.nodes if prev else ()) + (node.name,))
    return [w for name, w in found.items() if name not in kept]


def _two_four(array: np.ndarray, axis: int) -> np.ndarray:
    moved = np.moveaxis(np.abs(array), axis, -1)
    shape = moved.shape
    groups = moved.reshape(-1, 4)
    order = np.argsort(groups, axis=1, kind="stable")
    mask = np.ones_like(groups, dtype=bool)
    np.put_along_axis(mask, order[:, :2], False, axis=1)
    return np.moveaxis(mask.reshape(shape), -1, axis)


def masks(
    model: ir.Model,
    *,
    sparsity: float = 0.5,
    pattern: str = "unstructured",
    scope: str = "global",
    keep: frozenset[str] = frozenset(),
) -> tuple[dict[str, np.ndarray], list[str]]:
    """Boolean masks (True = kept) by initializer name, and the names of layers left dense."""
    if pattern not in PATTERNS:
        raise OptionError(f"sparsity pattern {pattern!r}: choose one of {', '.join(PATTERNS)}")
    if scope not in SCOPES:
        raise OptionError(f"sparsity scope {scope!r}: choose one of {', '.join(SCOPES)}")
    if pattern == "unstructured" and not 0 <= sparsity < 1:
        raise OptionError(f"sparsity {sparsity}: choose a fraction in [0, 1)")
    weights = prunable_weights(model, keep=keep)
    arrays = {w.name: model.graph.initializers[w.name].const_value.numpy() for w in weights}
    out: dict[str, np.ndarray] = {}
    dense: list[str] = []
    if pattern == "2:4":
        for w in weights:
            a = arrays[w.name]
            if a.shape[w.axis] % 4:
                dense.append(w.name)
                continue
            out[w.name] = _two_four(a, w.axis)
        return out, dense
    if scope == "layer":
        for w in weights:
            a = np.abs(arrays[w.name]).reshape(-1)
            k = int(round(sparsity * a.size))
            out[w.name] = _keep_largest(np.abs(arrays[w.name]), a.size - k)
        return out, dense
    flat = (
        np.concatenate([np.abs(arrays[w.name]).reshape(-1) for w in weights])
        if weights
        else np.zeros(0)
    )
    k = int(round(sparsity * flat.size))
    if k == 0:
        return {w.name: np.ones(arrays[w.name].shape, bool) for w in weights}, dense
    threshold = np.partition(flat, k - 1)[k - 1]
    # ties at the threshold are broken so that exactly k weights go
    below = flat < threshold
    at = np.flatnonzero(flat == threshold)[: k - int(below.sum())]
    keep_flat = ~below
    keep_flat[at] = False
    start = 0
    for w in weights:
        n = arrays[w.name].size
        out[w.name] = keep_flat[start : start + n].reshape(arrays[w.name].shape)
        start += n
    return out, dense


def _keep_largest(magnitude: np.ndarray, n: int) -> np.ndarray:
    flat = magnitude.reshape(-1)
    mask = np.zeros(flat.size, bool)
    if n > 0:
        mask[np.argsort(-flat, kind="stable")[:n]] = True
    return mask.reshape(magnitude.shape)


def apply_masks(model: ir.Model, masks_by_name: dict[str, np.ndarray]) -> None:
    """Zero the masked weights of ``model`` in place."""
    for name, mask in masks_by_name.items():
        value = model.graph.initializers[name]
        array = value.const_value.numpy()
        value.const_value = ir.tensor(
            np.where(mask, array, np.zeros((), array.dtype)).astype(array.dtype), name=name
        )


def sparsity_of(model: ir.Model, names: list[str] | None = None) -> float:
    """The fraction of zeros in the named weights (default: every prunable weight)."""
    names = names if names is not None else [w.name for w in prunable_weights(model)]
    total = zeros = 0
    for name in names:
        a = const_array(model.graph.initializers[name])
        total += a.size
        zeros += int(a.size - np.count_nonzero(a))
    return zeros / total if total else 0.0


def mask_module(module, masks_by_name: dict[str, np.ndarray]) -> None:
    """Reparametrize ``module``'s weights as ``w ⊙ mask`` (``torch.nn.utils.parametrize``)."""
    import torch
    from torch.nn.utils import parametrize

    class _Mask(torch.nn.Module):
        def __init__(self, mask: np.ndarray):
            super().__init__()
            self.register_buffer("mask", torch.from_numpy(mask.astype(np.float32)))

        def forward(self, w):
            return w * self.mask.to(w.dtype)

    for name, mask in masks_by_name.items():
        attr = module.onnx_names.get(name)
        if attr is None or attr not in dict(module.named_parameters(recurse=False)):
            continue
        parametrize.register_parametrization(module, attr, _Mask(mask))
