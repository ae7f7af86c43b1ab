"""Weight sharing: each layer's remaining weights replaced by one of ``2**bits`` shared values.

``share(array, mask, bits)`` clusters the layer's kept (non-pruned) weights with 1-D k-means from a
*linear* initialization (centroids evenly spaced between the smallest and largest weight: Han et
al. found it keeps the rare large weights, which matter most, better than density-based starts),
and returns the codebook and each weight's code. ``shared_module`` then trains the codebooks, not
the weights: a weight is ``codebook[code] * mask``, so the gradient reaching a centroid is the sum
of the gradients of the weights that share it, as in the paper. With ``float16``, the forward
pass rounds the codebooks to float16 (straight through, see ``half``), the precision the ``.mpz``
stores them in.
"""

from __future__ import annotations

import numpy as np

from modelpress.compress.deep.half import straight_through
from modelpress.errors import OptionError


def share(
    array: np.ndarray, mask: np.ndarray, bits: int, *, iterations: int = 30
) -> tuple[np.ndarray, np.ndarray]:
    """``(codebook, codes)``: float32 centroids (``2**bits`` at most) and int64 codes shaped like
    ``array`` (0 where the mask is False)."""
    if not 1 <= bits <= 8:
        raise OptionError(f"bits {bits}: weight sharing uses 1 to 8 bits per weight")
    values = array[mask].astype(np.float64)
    k = 2**bits
    if values.size == 0:
        return np.zeros(1, np.float32), np.zeros(array.shape, np.int64)
    lo, hi = float(values.min()), float(values.max())
    centroids = np.linspace(lo, hi, k) if hi > lo else np.array([lo])
    for _ in range(iterations):
        edges = (centroids[1:] + centroids[:-1]) / 2
        assign = np.searchsorted(edges, values)
        sums = np.bincount(assign, weights=values, minlength=len(centroids))
        counts = np.bincount(assign, minlength=len(centroids))
        moved = np.where(counts > 0, sums / np.maximum(counts, 1), centroids)
        if np.allclose(moved, centroids, rtol=0, atol=1e-12):
            break
        centroids = np.sort(moved)
    centroids = centroids.astype(np.float32)
    edges = (centroids[1:].astype(np.float64) + centroids[:-1]) / 2
    codes = np.zeros(array.shape, np.int64)
    codes[mask] = np.searchsorted(edges, values)
    return centroids, codes


def shared_module(
    module, layers: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], *, float16: bool = False
) -> list:
    """Reparametrize ``module``'s weights as ``codebook[codes] * mask``; ``layers`` maps an
    initializer name to ``(codebook, codes, mask)``. Returns the codebook parameters to train."""
    import torch
    from torch.nn.utils import parametrize

    class _Shared(torch.nn.Module):
        def __init__(self, codebook: np.ndarray, codes: np.ndarray, mask: np.ndarray):
            super().__init__()
            self.codebook = torch.nn.Parameter(torch.from_numpy(codebook.astype(np.float32)))
            self.register_buffer("codes", torch.from_numpy(codes.astype(np.int64)))
            self.register_buffer("mask", torch.from_numpy(mask.astype(np.float32)))

        def forward(self, w):
            book = straight_through(self.codebook) if float16 else self.codebook
            return book[self.codes].to(w.dtype) * self.mask.to(w.dtype)

    params = []
    for name, (codebook, codes, mask) in layers.items():
        attr = module.onnx_names.get(name)
        if attr is None:
            continue
        param = _Shared(codebook, codes, mask)
        parametrize.register_parametrization(module, attr, param, unsafe=True)
        getattr(module.parametrizations, attr).original.requires_grad_(False)
        params.append(param.codebook)
    return params
