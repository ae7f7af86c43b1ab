"""Activation-aware scaling (AWQ): input channels that carry large activations get finer steps.

Lin et al. 2023, "AWQ: Activation-aware Weight Quantization". For ``y = x @ W``, multiplying row
``k`` of ``W`` by ``s_k`` and dividing input channel ``k`` by it leaves ``y`` unchanged in float;
quantized, the rows of the channels with large ``|x|`` are rounded on a relatively finer grid,
and their rounding error (which ``|x|`` multiplies) shrinks. ``s = mean|x|^α`` (normalised so
its geometric range is centred on 1), ``α`` from ``ALPHAS`` chosen by the output error of the
whole group (every MatMul that reads ``x``) after rounding on min/max block grids, measured on
the odd calibration windows; ``α = 0`` (no scaling) is always a candidate, so
scaling is kept only where it measurably helps rounding to nearest (``quantize.py``'s ``auto``
judges it again after the quantizers it will actually use).

``x / s`` must cost nothing at run time, so ``1/s`` is folded into what produces ``x``:

- a normalization's scale (and bias): ``RMSNormalization``, ``LayerNormalization``,
  ``SimplifiedLayerNormalization``, ``SkipSimplifiedLayerNormalization``, ``SkipLayerNormalization``;
- a ``Mul`` by a constant vector;
- ``Mul(act(gate), up)`` where ``up`` is a ``Split`` slice (last axis) of a MatMul with a constant
  weight (the fused gate|up projection of a gated MLP): the ``up`` columns of that weight (and of
  its bias) are divided by ``s``.

A group whose input comes from anything else (attention's context before ``o_proj``, GELU), or
whose input feeds anything but the group, is left unscaled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from modelpress.compress.llm.grid import block_grid, codes_on_grid, dequantize_codes
from modelpress.compress.quantize.gptq import output_error
from modelpress.ir.match import const_array

ALPHAS = tuple(round(a, 2) for a in np.linspace(0.0, 1.0, 11))
NORM_PARAMS = {
    "RMSNormalization": (1,),
    "LayerNormalization": (1, 2),
    "SimplifiedLayerNormalization": (1,),
    "SkipSimplifiedLayerNormalization": (2,),
    "SkipLayerNormalization": (2, 3),
}
SEARCH_COLUMNS = 512  # columns of each weight the α search looks at (evenly spaced)


@dataclass
class Fold:
    """Where ``1/s`` of one group goes: constants of the graph (``(value, None)``) and column
    ranges of other MatMuls' weights (``(node name, offset)``, with its bias value if any)."""

    constants: list[ir.Value]
    columns: list[tuple[str, int, ir.Value | None]]


def _vector(value: ir.Value | None, k: int) -> bool:
    a = const_array(value)
    return a is not None and a.dtype == np.float32 and a.shape[-1:] == (k,) and a.size == k


def find_fold(x: ir.Value, group: list[ir.Node], k: int) -> Fold | None:
    """Where ``1/s`` for the input ``x`` of ``group`` can go (module docstring), or ``None``."""
    if x.is_graph_output() or {u.node for u in x.uses()} != set(group):
        return None
    p = x.producer()
    if p is None:
        return None
    if p.op_type in NORM_PARAMS and p.outputs[0] is x:
        params = [p.inputs[i] for i in NORM_PARAMS[p.op_type] if len(p.inputs) > i]
        params = [v for v in params if v is not None]
        if params and all(_vector(v, k) and len(v.uses()) == 1 for v in params):
            return Fold(params, [])
        return None
    if p.op_type != "Mul":
        return None
    for i in (0, 1):
        v = p.inputs[i]
        if _vector(v, k) and len(v.uses()) == 1:
            return Fold([v], [])
    for i in (0, 1):
        col = _split_columns(p.inputs[i], k)
        if col is not None:
            return Fold([], [col])
    return None


def _split_columns(v: ir.Value, k: int) -> tuple[str, int, ir.Value | None] | None:
    """``(MatMul name, column offset, bias)`` when ``v`` is a last-axis Split slice of a MatMul
    with a constant weight (through an ``Add`` of a constant bias)."""
    split = v.producer()
    if split is None or split.op_type != "Split" or len(v.uses()) != 1:
        return None
    axis = split.attributes.get_int("axis", 0)
    sizes = const_array(split.inputs[1]) if len(split.inputs) > 1 else None
    if sizes is None or axis not in (-1, 2):
        return None
    index = list(split.outputs).index(v)
    offset = int(np.sum(sizes[:index]))
    if int(sizes[index]) != k:
        return None
    src, bias = split.inputs[0], None
    prod = src.producer()
    if prod is not None and prod.op_type == "Add":
        for j in (0, 1):
            if const_array(prod.inputs[j]) is not None:
                bias = prod.inputs[j]
                prod = prod.inputs[1 - j].producer()
                break
    if prod is None or prod.op_type != "MatMul" or const_array(prod.inputs[1]) is None:
        return None
    if bias is not None and len(bias.uses()) != 1:
        return None
    return prod.name, offset, bias


def apply_fold(fold: Fold, s: np.ndarray, weights: dict[str, np.ndarray]) -> None:
    """Divide the fold's targets by ``s``: graph constants in place, and columns of the float
    weights in ``weights`` (by MatMul name) before they are quantized."""
    for v in [*fold.constants, *(b for _, _, b in fold.columns if b is not None)]:
        a = const_array(v)
        if v in fold.constants:
            new = (a / s.reshape(a.shape)).astype(np.float32)
        else:  # a bias over the fused columns: only the folded range
            name, off, _ = next(c for c in fold.columns if c[2] is v)
            new = a.copy().reshape(-1)
            new[off : off + len(s)] /= s
            new = new.reshape(a.shape).astype(np.float32)
        v.const_value = ir.tensor(new, name=v.name)
    for name, off, _ in fold.columns:
        w = weights[name]
        w[:, off : off + len(s)] = w[:, off : off + len(s)] / s[None, :]


def scales_for(mean_abs: np.ndarray, alpha: float) -> np.ndarray:
    m = np.maximum(mean_abs, 1e-6 * max(float(mean_abs.max()), 1e-12))
    s = m**alpha
    s = s / np.sqrt(s.max() * s.min())
    return s.astype(np.float64)


def search(
    weights: list[np.ndarray],
    h_fit: np.ndarray,
    h_eval: np.ndarray,
    mean_abs: np.ndarray,
    *,
    bits: int,
    block_size: int,
    symmetric: bool,
    float_zero_point: bool = False,
) -> tuple[float, np.ndarray, dict[float, float]]:
    """``(α, s, {α: group output error})`` with the least error on ``h_eval`` (module
    docstring). As in the paper, the search rounds on min/max grids (the clip search comes
    after, on the chosen scales); ``h_fit`` is kept for the signature's symmetry with the
    other fits and is not read."""
    sampled = []
    for w in weights:
        step = max(1, w.shape[1] // SEARCH_COLUMNS)
        sampled.append(np.asarray(w[:, ::step], np.float64))
    errors = {}
    best = None
    for alpha in ALPHAS:
        s = scales_for(mean_abs, alpha)
        err = 0.0
        for w in sampled:
            ws = (w * s[:, None]).astype(np.float32)
            scale, zp = block_grid(
                ws,
                bits=bits,
                block_size=block_size,
                symmetric=symmetric,
                float_zero_point=float_zero_point,
            )
            codes = codes_on_grid(ws, scale, zp, bits, block_size)
            w_hat = dequantize_codes(codes, scale, zp, bits, block_size) / s[:, None]
            err += output_error(w, w_hat, h_eval)
        errors[alpha] = err
        if best is None or err < errors[best]:
            best = alpha
    return float(best), scales_for(mean_abs, best), errors
