"""Which MatMuls of an LLM carry its int4 loss: measured end to end, one weight at a time.

A layer's own output error (``compress.quantize.gptq.output_error``) says how well a weight is rounded, not what the
rounding costs the model: an error early in the residual stream, or in a layer the rest of the
network amplifies, costs more than the same error elsewhere.

So each candidate weight is measured directly: the float decoder runs on a few windows of the
calibration text with that one weight replaced by its 4-bit rounding (min/max blocks of the
requested size), and its cost is the mean KL divergence of the next-token distributions from
the float model's, per token. The weights become overridable initializers of one session (each
listed as a graph input with its float value as default), so a measurement is one forward pass
with one extra feed: ``len(weights) × windows`` passes in all.

The costs add up to first order (a small perturbation of each weight); ``choose`` keeps the
weights whose removal from int4 saves the most.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx_ir as ir

from modelpress.compress.llm.calibrate import decoder_of, text_windows
from modelpress.compress.llm.grid import block_grid, codes_on_grid, dequantize_codes
from modelpress.ir import llm

WINDOWS = 2  # calibration windows a weight is judged on
SEQ_LEN = 256  # tokens a window


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def rounded(w: np.ndarray, *, bits: int, block_size: int, symmetric: bool) -> np.ndarray:
    """``w`` rounded to nearest on its blocks' min/max grids."""
    scale, zp = block_grid(w, bits=bits, block_size=block_size, symmetric=symmetric)
    codes = codes_on_grid(w, scale, zp, bits, block_size)
    return dequantize_codes(codes, scale, zp, bits, block_size).astype(np.float32)


def measure(
    folder: Path,
    model: ir.Model,
    nodes: list[ir.Node],
    text: str,
    *,
    bits: int = 4,
    block_size: int,
    symmetric: bool,
    windows: int = WINDOWS,
    seq_len: int = SEQ_LEN,
    threads: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, float]:
    """``{MatMul name: mean KL per token}`` with that MatMul's weight rounded alone (module
    docstring). ``model`` is left as it was."""
    weights = {n.name: n.inputs[1] for n in nodes}
    added = list({id(v): v for v in weights.values() if v not in model.graph.inputs}.values())
    model.graph.inputs.extend(added)
    try:
        decoder = decoder_of(folder, model, threads=threads)
    finally:
        for v in added:
            model.graph.inputs.remove(v)
    session = decoder.session
    feeds = [
        decoder.feeds(ids[None])
        for ids in text_windows(decoder, text, seq_len=seq_len, samples=windows)
    ]
    ref = [np.exp(_log_softmax(session.run([llm.LOGITS], f)[0][0])) for f in feeds]
    ref_log = [np.log(np.maximum(p, 1e-300)) for p in ref]
    cost: dict[str, float] = {}
    for i, node in enumerate(nodes):
        value = weights[node.name]
        w = value.const_value.numpy().astype(np.float32)
        w_hat = rounded(w, bits=bits, block_size=block_size, symmetric=symmetric)
        kl, count = 0.0, 0
        for f, p, lp in zip(feeds, ref, ref_log):
            out = session.run([llm.LOGITS], {**f, value.name: w_hat})[0][0]
            kl += float(np.sum(p * (lp - _log_softmax(out))))
            count += len(p)
        cost[node.name] = kl / max(count, 1)
        if progress:
            progress(i + 1, len(nodes))
    return cost


def choose(cost: dict[str, float], count: int) -> set[str]:
    """The ``count`` weights whose rounding costs the most."""
    return set(sorted(cost, key=cost.get, reverse=True)[: max(count, 0)])
