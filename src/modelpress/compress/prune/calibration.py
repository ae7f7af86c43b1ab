"""What the data says about removable neurons and attention heads: one pass over calibration
samples gives their data-aware importance and the statistics of the layers that read them.

A neuron or head leaves a dense layer's computation only through the *readers* of its units: the
MatMul (or Gemm) whose input carries them (an FFN's output projection reading its neurons, the
attention output projection reading the heads' concatenated contexts). Removing a unit is the
same as multiplying its slice of that input by zero. So, on the data, with ``a`` the reader's input
and ``g`` the gradient of the outputs reaching it:

- ``fisher``: Σ over samples of (Σ over the unit's entries of ``a · g``)², where ``g`` is the
  gradient of ``r · outputs`` for a random Gaussian ``r`` per sample: in expectation, the squared
  first-order change of every output when the unit is masked (the Fisher information of a unit
  mask, as Kwon et al. 2022 score heads and neurons, with the outputs themselves as the target so
  that no labels are needed);
- ``obs``: the order of greedy removal with the reader refit (``refit.removal_order``), from the
  Gram matrix of the reader's input gathered here.

``activation`` (``importance.py``, the default) measures the same readers' inputs without
gradients. Tokens the outputs do not depend on (padding: their gradient is exactly zero) are left
out of the readers' input Gram matrices, which ``refit`` uses. Groups of other kinds (convolution
channels) and units with no reader keep the ``l1`` weight score.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from modelpress.compress.prune import importance as imp
from modelpress.compress.prune.depgraph import DepGraph, Slice, Track, param

METHODS = ("fisher", "obs")
KINDS = ("neurons", "heads")


@dataclass
class Reader:
    """A MatMul/Gemm reading the units of ``value`` (its data input) through weight rows."""

    slice: Slice
    track: Track
    weight: np.ndarray  # (input features, output features)
    fisher: np.ndarray = field(init=False)  # per unit
    gram: np.ndarray = field(init=False)  # [a, 1]ᵀ[a, 1] over the tokens counted
    tokens: int = 0

    def __post_init__(self):
        self.fisher = np.zeros(self.track.units)
        self.gram = np.zeros((self.track.size + 1, self.track.size + 1))

    @property
    def value(self) -> str:
        return self.slice.value


def readers(dg: DepGraph) -> list[Reader]:
    """The readers of every neuron and head group's units (see the module docstring)."""
    kinds = {}
    for g in dg.groups:
        if g.kind in KINDS:
            kinds.update(dict.fromkeys(g.values, g.kind))
    out = []
    for s in dg.slices:
        node = s.node
        if s.role != "weight" or s.input != 1 or s.value not in kinds or node.inputs[0] is None:
            continue
        if node.inputs[0].name != s.value or node.op_type not in ("MatMul", "Gemm"):
            continue
        w = param(node.inputs[1])
        track = dg.tracks[s.value]
        if node.op_type == "Gemm":
            if int(_attr(node, "transA", 0)):
                continue
            if int(_attr(node, "transB", 0)):
                w = w.T
        if (
            w is None
            or w.ndim != 2
            or track.axis != len(dg.shapes[s.value]) - 1
            or w.shape[0] != track.size
        ):
            continue
        out.append(Reader(s, track, np.asarray(w, dtype=np.float64)))
    return out


def _attr(node: ir.Node, name: str, default):
    a = node.attributes.get(name)
    return default if a is None else a.value


def observe(model: ir.Model, found: list[Reader], batches, *, seed: int = 0) -> None:
    """Accumulate each reader's statistics over ``batches`` (``Batch``es of ``model``'s inputs)."""
    import torch

    from modelpress.compress.train import trainable
    from modelpress.compress.train.loop import to_tensors

    names = list(dict.fromkeys(r.value for r in found))
    module = trainable(model, features=names).eval()
    n_out = len(model.graph.outputs)
    gen = torch.Generator().manual_seed(seed)
    for batch in batches:
        out = module(**to_tensors(batch.feeds, "cpu"))
        out = out if isinstance(out, tuple) else (out,)
        targets = [o for o in out[:n_out] if o.dtype.is_floating_point and o.requires_grad]
        acts = dict(zip(names, out[n_out:]))
        probe = sum((torch.randn(o.shape, generator=gen) * o).sum() for o in targets)
        grads = dict(
            zip(names, torch.autograd.grad(probe, [acts[n] for n in names], allow_unused=True))
        )
        for r in found:
            a = acts[r.value].detach()
            g = grads[r.value]
            _accumulate(r, a.double().numpy(), None if g is None else g.double().numpy())


def _accumulate(r: Reader, a: np.ndarray, g: np.ndarray | None) -> None:
    units, block = r.track.units, r.track.block
    samples = a.shape[0]
    a = a.reshape(samples, -1, r.track.size)
    if g is None:  # the outputs do not depend on this input at all
        g = np.zeros_like(a)
    g = g.reshape(a.shape)
    per_sample = (a * g).reshape(samples, a.shape[1], units, block).sum(axis=(1, 3))
    r.fisher += (per_sample**2).sum(axis=0)
    live = np.abs(g).max(axis=2) > 0  # (samples, tokens): tokens that reach an output
    x = a[live]  # (tokens, features)
    r.tokens += len(x)
    x1 = np.concatenate([x, np.ones((len(x), 1))], axis=1).astype(np.float32)
    r.gram += x1.T @ x1


def scores(dg: DepGraph, found: list[Reader]) -> dict:
    """Component id → score: ``fisher`` for the components with a reader, ``l1`` for the rest."""
    out = imp.scores(dg, "l1")
    measured: dict = {}
    for r in found:
        for u, v in enumerate(r.fisher):
            c = dg.uf.find((r.value, u))
            measured[c] = measured.get(c, 0.0) + float(v)
    out.update(measured)
    return out
