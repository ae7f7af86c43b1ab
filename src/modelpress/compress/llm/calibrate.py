"""Calibration statistics of an LLM's MatMul inputs, from text.

The float decoder runs on windows of ``seq_len`` tokens of the calibration text (the folder's
tokenizer; windows do not overlap), with every quantizable MatMul's input added as an output.
For each distinct input (the MatMuls that share one, like a fused q|k|v projection, share its
statistics) it keeps ``H = XᵀX / rows`` and ``mean |x|`` per channel, and ``H`` twice more, on
the even and on the odd windows: a method is fitted on one half and judged on the other
(``select.py``), so that the choice rests on text the fit did not see.

``sink_weight`` makes the first position of every window count that many times in them. A
decoder's first token is its attention sink: most heads of every later position attend to its keys
and values, and it carries the model's massive activations (on SmolLM2 one direction of the q|k|v
and gate|up inputs' ``H`` holds about 340 times the mean eigenvalue, 1500 times for one down
projection), so an error on it reaches every token after it, which one row in ``seq_len`` does not
say. Measured on SmolLM2-135M with its residual stream rotated (block 32, perplexity on Python's
license against float, ``benchmarks/results/llm.md``): GPTQ on every layer +21.0% counted once,
+15.5% eight times, +19.3% 32 times, +104% with the position left out; but ``auto`` +27.2% once,
+32.2% eight times. One model, unlike methods: hence 1 (off) by default.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir

from modelpress.errors import InputError
from modelpress.ir import llm, save
from modelpress.ir.match import const_array
from modelpress.runtime import ort as ort_backend
from modelpress.verify.llm import Decoder


@dataclass
class InputStats:
    """Statistics of one MatMul input over the calibration windows."""

    halves: list = field(default_factory=lambda: [None, None])  # XᵀX of even / odd windows
    rows: list = field(default_factory=lambda: [0, 0])
    abs_sum: np.ndarray | None = None

    def add(self, x: np.ndarray, half: int, *, first_weight: float = 1.0) -> None:
        """Rows of ``x`` (``[..., positions, channels]``); the first position of each sequence
        counts ``first_weight`` times."""
        weights = None
        if x.ndim >= 2 and first_weight != 1.0:
            weights = np.ones(x.shape[:-1])
            weights[..., 0] = first_weight
            weights = weights.reshape(-1)
        x = x.reshape(-1, x.shape[-1]).astype(np.float64)
        if weights is None:
            weights = np.ones(len(x))
        xtx = (x * weights[:, None]).T @ x
        self.halves[half] = xtx if self.halves[half] is None else self.halves[half] + xtx
        self.rows[half] += float(weights.sum())
        a = weights @ np.abs(x)
        self.abs_sum = a if self.abs_sum is None else self.abs_sum + a

    def hessian(self, half: int | None = None) -> np.ndarray:
        """``XᵀX / rows`` of one half (0, 1) or of all windows (``None``)."""
        if half is not None and self.halves[half] is not None:
            return self.halves[half] / self.rows[half]
        total = sum(h for h in self.halves if h is not None)
        return total / sum(self.rows)

    @property
    def split(self) -> bool:
        return all(h is not None for h in self.halves)

    def mean_abs(self) -> np.ndarray:
        return self.abs_sum / sum(self.rows)


def quantizable_matmuls(model: ir.Model) -> list[ir.Node]:
    """MatMul nodes whose ``B`` is a float32 2-D constant ``[K, N]``."""
    out = []
    for node in model.graph:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
            continue
        w = const_array(node.inputs[1])
        if w is not None and w.dtype == np.float32 and w.ndim == 2:
            out.append(node)
    return out


def text_windows(decoder: Decoder, text: str, *, seq_len: int, samples: int) -> list[np.ndarray]:
    ids = decoder.encode(text)
    if len(ids) < 2:
        raise InputError("the calibration text has fewer than 2 tokens")
    seq_len = min(seq_len, decoder.config.max_context, len(ids))
    starts = list(range(0, len(ids) - seq_len + 1, seq_len))[:samples]
    return [ids[s : s + seq_len] for s in starts]


def collect(
    folder: Path,
    model: ir.Model,
    nodes: list[ir.Node],
    text: str,
    *,
    seq_len: int = 512,
    samples: int = 32,
    threads: int | None = None,
    sink_weight: float = 1.0,
) -> tuple[dict[str, InputStats], int]:
    """``{input name: InputStats}`` of ``nodes``' inputs on the text, and the tokens seen;
    ``sink_weight``: how many times each window's first position counts (module docstring).
    ``model`` is left as it was (its outputs are restored)."""
    names = sorted({n.inputs[0].name for n in nodes})
    values = {n.inputs[0].name: n.inputs[0] for n in nodes}
    added = []
    for name in names:
        v = values[name]
        if v.is_graph_output():
            continue
        if v.type is None:
            v.type = ir.TensorType(ir.DataType.FLOAT)
        model.graph.outputs.append(v)
        added.append(v)
    try:
        decoder = decoder_of(folder, model, threads=threads)
    finally:
        for v in added:
            model.graph.outputs.remove(v)
    stats = {name: InputStats() for name in names}
    tokens = 0
    for i, ids in enumerate(text_windows(decoder, text, seq_len=seq_len, samples=samples)):
        outs = decoder.session.run(names, decoder.feeds(ids[None]))
        for name, x in zip(names, outs):
            stats[name].add(x, i % 2, first_weight=sink_weight)
        tokens += len(ids)
    return stats, tokens


def decoder_of(folder: Path, model: ir.Model, *, threads: int | None = None) -> Decoder:
    """``folder``'s decoder (tokenizer, config) running ``model`` as it is now (an edited copy
    of the folder's graph), under ONNX Runtime's basic optimizations."""
    base = Decoder.open(folder, threads=threads)
    with tempfile.TemporaryDirectory(prefix="modelpress-calib-") as tmp:
        path = Path(tmp) / llm.MODEL_FILE
        save(model, path, external_data=True)
        so = ort_backend.session_options(optimize="basic", intra_op_threads=threads)
        session = ort_backend.session(path, options=so)  # holds its weights: the file can go
    return Decoder(folder, base.config, session, base.tokenizer, base.input_names)
