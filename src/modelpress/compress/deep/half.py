"""Float16 for what an ``.mpz`` stores beside the shared weights: codebooks and side tensors.

In a small network the tensors that pruning and sharing leave alone (biases, the normalizations
folded into them, depthwise or kept layers' scales) and the codebooks weigh as much as the shared
weights themselves, so they are stored in half the bytes. Rounding to float16 changes them by at
most 2^-11 of their value; it is done before the last retraining, which trains through it (a
straight-through rounding: the forward pass uses the rounded value, the gradient reaches the
float32 one), so the network adapts to the values it is stored with. ``mpz`` then stores a tensor
as float16 only where that is exact, so decoding still gives the trained model bit for bit.

Scalars are not rounded: they cost four bytes and are often constants where rounding matters (an
epsilon of 1e-12 is zero in float16); neither are tensors with values beyond float16's range.
"""

from __future__ import annotations

import numpy as np

HALF_MAX = 65504.0


def roundable(array: np.ndarray) -> bool:
    """Whether ``array`` is a float32 tensor of more than one value, all within float16's range."""
    return array.dtype == np.float32 and array.size > 1 and bool(np.all(np.abs(array) <= HALF_MAX))


def rounded(array: np.ndarray) -> np.ndarray:
    """``array``'s values rounded to the nearest float16, in ``array``'s dtype."""
    return array.astype(np.float16).astype(array.dtype)


def straight_through(t):
    """``t`` rounded to float16 in the forward pass, the identity for gradients."""
    return t + (t.half().to(t.dtype) - t).detach()


def half_module(module, names: list[str]) -> None:
    """Reparametrize ``module``'s initializers ``names`` as their float16 rounding (trained
    straight through)."""
    import torch
    from torch.nn.utils import parametrize

    class _Half(torch.nn.Module):
        def forward(self, w):
            return straight_through(w)

    params = dict(module.named_parameters(recurse=False))
    for name in names:
        attr = module.onnx_names.get(name)
        if attr is not None and attr in params:
            parametrize.register_parametrization(module, attr, _Half())
