"""``quantize_llm``: int4/int8 weights for the MatMuls of an LLM folder, chosen by evidence.

What is quantized: every MatMul whose ``B`` is a constant float ``[K, N]`` (the projections of
every layer), in blocks of ``block_size`` along ``K`` (``ir.nbits``), written as ``MatMulNBits``
(``level="ort"``, the fast kernel) or ``DequantizeLinear`` + ``MatMul`` (``level="standard"``,
opset 21). The LM head (the MatMul with ``N = vocab``) and the embedding table (a ``Gather`` of a
``[vocab, hidden]`` constant; a tied head is a copy of it in the folder, both are quantized)
follow ``embeddings``: ``int8`` (the default: symmetric 8-bit blocks, a small loss on the
largest tensors of a small model), ``int4`` or ``float``; the table is written as
``GatherBlockQuantized`` (or ``DequantizeLinear`` + ``Gather``).

Grids (``grid.py``): asymmetric blocks take integer zero points of the code type by default
(their range holds 0; with data the best integer (scale, zero point) pair is searched).
``float_zero_points`` (``MatMulNBits`` only, 4 bits) takes float zero points instead: each
block's own range, no forced 0. They reproduce weights that came from Q4_1-style blocks exactly,
but on weights not from such blocks rounding to nearest on them measured WORSE end to end
(SmolLM2 rotated, block 32: perplexity 19.90 against 18.57 with integer zero points, float
11.71), although their per-layer output error on the calibration inputs is lower
(``benchmarks/results/llm.md``); hence off by default.

How (``method``):

- ``rtn``: each block's min/max range, rounded to nearest; needs no calibration text.
- ``awq``: activation-aware scales (``awq.py``) and the per-block grid search (``grid.py``,
  weighted by the calibration inputs), rounded to nearest.
- ``gptq``: codes by GPTQ (``gptq.py``; ``act_order`` optional), each block's grid searched on
  the block's rows as GPTQ's updates have left them when its first row comes.
- ``auto`` (the default with data): per layer the best of grid-searched rounding, GPTQ and
  GPTQ with act-order, each fitted on the even calibration windows and judged by its output
  error ``tr(DᵀHD)`` on the odd ones, on ``SELECT_COLUMNS`` evenly spaced columns (columns are
  quantized independently); the winner is fitted again on all windows and columns. Before that,
  AWQ's scale search: its ``α`` is chosen with rounding to nearest, as in the paper, so a group
  keeps its scales only if they also lower the group's held-out error after these candidates
  (on SmolLM2 with its residual stream rotated, most groups turn them down, and perplexity
  over float went from +27.2% to +25.1% at block 32 and from +47.4% to +34.5% at block 128;
  ``benchmarks/results/llm.md``). The per-layer errors are in the result.

Calibration text: ``data``, a text file, best of the domain the model will serve. Without it,
int4 calibrates on text sampled from the float model itself (``sampled.py``; said in the notes
and in the folder's record), and int8 (a small loss without help) rounds to nearest.

Statistics come from the float model, all layers at once (``calibrate.py``): one pass over the
text. ``stages`` > 1 (sequential calibration): the body MatMuls, in graph order, are cut into
that many runs, and the inputs of each run after the first are measured again through the runs
already quantized (one more pass over the text each), so that a layer is fitted to the inputs it
will see. ``int8_layers``: that many body MatMuls, those whose 4-bit rounding costs the model the most
(measured end to end on the calibration text, ``sensitivity.py``; without text, the largest
relative weight error), are written at 8 bits (symmetric) instead: a larger file, said in the
result's layers with each measured cost. By default a tenth of them (``INT8_SHARE``) when
there is calibration text, the user's or sampled, as llama.cpp's mixed 4-bit types and
onnxruntime-genai's ``k_quant_mixed`` keep some layers wider: measured, 12 of SmolLM2-135M's 120
(rotated, calibration sampled) took perplexity over float from +15.1% to +9.7% at block 32 and
from +25.2% to +20.0% at block 128 for a 4% larger file and no measurable decode cost, and 2 of
glassllm's 16 halved its KL from float (``benchmarks/results/llm.md``); ``0`` keeps every body
MatMul at 4 bits. ``tune_steps``: then every block scale is tuned end to
end against the float model on the calibration text, the codes kept (``tune.py``; the result's
``tuning`` says what it did; the scales are kept only if the held-out KL went down).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx_ir as ir

from modelpress.compress.llm import awq, calibrate, sampled, sensitivity, tune
from modelpress.compress.llm.gptq import gptq
from modelpress.compress.llm.grid import (
    block_grid,
    codes_on_grid,
    dequantize_codes,
    to_blocks,
    zero_point_form,
)
from modelpress.compress.llm.output import check_output, write_folder
from modelpress.compress.quantize.gptq import output_error
from modelpress.errors import OptionError
from modelpress.ir import llm, load, nbits
from modelpress.ir.graph import remove_unused_initializers, swap_node
from modelpress.ir.match import const_array
from modelpress.ir.opset import at_opset
from modelpress.verify.llm import read_text

MODES = {"int4": 4, "int8": 8}
METHODS = ("auto", "rtn", "awq", "gptq")
EMBEDDINGS = {"int8": 8, "int4": 4, "float": None}
LEVELS = ("ort", "standard")
BLOCK_SIZES = (16, 32, 64, 128, 256)
SELECT_COLUMNS = 192  # columns of a weight (evenly spaced) on which `auto` judges candidates
INT8_SHARE = 0.1  # of the body MatMuls kept at 8 bits by default (int4 with calibration text)


@dataclass
class LayerReport:
    name: str
    k: int
    n: int
    bits: int
    method: str  # what was kept: rtn, clip, gptq, gptq-act
    alpha: float  # the AWQ exponent of its input (0: unscaled)
    rel_error: float | None  # output error / output energy on the calibration text
    errors: dict = field(default_factory=dict)  # candidate → held-out output error
    int4_cost: float | None = None  # KL per token with this weight alone at int4 (measured)


@dataclass
class LLMQuantizeResult:
    output: str
    mode: str
    method: str
    block_size: int
    symmetric: bool
    level: str
    embeddings: str
    layers: list[LayerReport]
    notes: list[str]
    calibration_tokens: int
    size_before: int
    size_after: int
    seconds: float
    tuning: tune.TuneReport | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["methods_kept"] = self.methods_kept()
        return d

    def methods_kept(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for layer in self.layers:
            out[layer.method] = out.get(layer.method, 0) + 1
        return out


def _check_options(mode, block_size, method, embeddings, level, stages, int8_layers) -> None:
    if mode not in MODES:
        raise OptionError(f"`mode` {mode!r} is not one of {', '.join(MODES)} for an LLM folder")
    if block_size not in BLOCK_SIZES:
        raise OptionError(
            f"`block_size` {block_size} is not one of {', '.join(map(str, BLOCK_SIZES))}"
        )
    if method not in METHODS:
        raise OptionError(f"`method` {method!r} is not one of {', '.join(METHODS)}")
    if embeddings not in EMBEDDINGS:
        raise OptionError(f"`embeddings` {embeddings!r} is not one of {', '.join(EMBEDDINGS)}")
    if level not in LEVELS:
        raise OptionError(f"`level` {level!r} is not one of {', '.join(LEVELS)}")
    if stages < 1:
        raise OptionError(f"`stages` must be at least 1, got {stages}")
    if int8_layers is not None and int8_layers < 0:
        raise OptionError(f"`int8_layers` must be at least 0, got {int8_layers}")


def _candidates(method: str, act_order: bool | None) -> tuple[str, ...]:
    if method == "rtn":
        return ("rtn",)
    if method == "awq":
        return ("clip",)
    if method == "gptq":
        return ("gptq-act",) if act_order else ("gptq",)
    return (
        ("clip", "gptq", "gptq-act")
        if act_order is None
        else (("clip", "gptq-act") if act_order else ("clip", "gptq"))
    )


def _fit(kind, w, h, *, bits, block_size, form):
    """Grid and codes of ``w`` by one candidate, fitted on ``h``."""
    if kind.startswith("gptq"):
        return gptq(w, h, bits=bits, block_size=block_size, form=form, act_order=kind == "gptq-act")
    sym, fzp = form == "symmetric", form == "float"
    hh = None if kind == "rtn" else h
    scale, zp = block_grid(
        w, bits=bits, block_size=block_size, symmetric=sym, float_zero_point=fzp, h=hh
    )
    return codes_on_grid(w, scale, zp, bits, block_size), scale, zp


def held_out_errors(
    w: np.ndarray,
    stats: calibrate.InputStats,
    s: np.ndarray | None,
    *,
    candidates: tuple[str, ...],
    bits: int,
    block_size: int,
    form: str,
) -> dict[str, float]:
    """``{candidate: output error}`` of ``diag(s)·w`` fitted on the even calibration windows and
    judged on the odd ones (on all of them when the text fills one), in ``w``'s own units, on
    ``SELECT_COLUMNS`` evenly spaced columns (columns are quantized independently)."""
    s = np.ones(w.shape[0]) if s is None else s
    inv = 1.0 / np.outer(s, s)
    h_fit, h_eval = (stats.hessian(0), stats.hessian(1)) if stats.split else (stats.hessian(),) * 2
    wc = (w[:, :: max(1, w.shape[1] // SELECT_COLUMNS)] * s[:, None]).astype(np.float32)
    errors = {}
    for kind in candidates:
        codes, scale, zp = _fit(kind, wc, h_fit * inv, bits=bits, block_size=block_size, form=form)
        w_hat = dequantize_codes(codes, scale, zp, bits, block_size)
        errors[kind] = output_error(wc, w_hat, h_eval * inv)
    return errors


def quantize_weight(
    w: np.ndarray,
    stats: calibrate.InputStats | None,
    s: np.ndarray | None,
    *,
    bits: int,
    block_size: int,
    symmetric: bool,
    candidates: tuple[str, ...],
    float_zero_point: bool = False,
    errors: dict[str, float] | None = None,
) -> tuple[nbits.Blocks, str, dict, float | None]:
    """``(blocks of diag(s)·w, kept candidate, {candidate: held-out error}, relative error)``;
    ``float_zero_point``: asymmetric grids with float zero points (``grid.py``); ``errors``:
    the candidates' held-out errors when they were measured already (``held_out_errors``)."""
    s = np.ones(w.shape[0]) if s is None else s
    ws = (w * s[:, None]).astype(np.float32)
    form = zero_point_form(symmetric=symmetric, float_zero_point=float_zero_point)
    opts = dict(bits=bits, block_size=block_size, form=form)
    fzp = form == "float"
    if stats is None:
        codes, scale, zp = _fit("rtn", ws, None, **opts)
        return to_blocks(codes, scale, zp, bits, block_size, float_zero_point=fzp), "rtn", {}, None
    inv = 1.0 / np.outer(s, s)
    h_all = stats.hessian() * inv
    kept = candidates[0]
    if len(candidates) > 1:
        errors = errors or held_out_errors(w, stats, s, candidates=candidates, **opts)
        kept = min(errors, key=errors.get)
    else:
        errors = {}
    codes, scale, zp = _fit(kept, ws, h_all, **opts)
    w_hat = dequantize_codes(codes, scale, zp, bits, block_size)
    energy = float(np.sum((h_all @ ws.astype(np.float64)) * ws))
    rel = output_error(ws, w_hat, h_all) / max(energy, 1e-30)
    blocks = to_blocks(codes, scale, zp, bits, block_size, float_zero_point=fzp)
    return blocks, kept, errors, rel


def _embedding_tables(model: ir.Model, vocab: int) -> list[ir.Node]:
    out = []
    for node in model.graph:
        if node.op_type == "Gather" and node.domain in ("", "ai.onnx"):
            t = const_array(node.inputs[0])
            if t is not None and t.dtype == np.float32 and t.ndim == 2 and t.shape[0] == vocab:
                if node.attributes.get_int("axis", 0) == 0:
                    out.append(node)
    return out


def _table_block(d: int, block_size: int) -> int | None:
    b = block_size
    while b >= 16:
        if d % b == 0:
            return b
        b //= 2
    return None


def quantize_llm(
    folder: str | os.PathLike,
    output: str | os.PathLike,
    *,
    mode: str = "int4",
    block_size: int = 32,
    symmetric: bool = False,
    method: str = "auto",
    act_order: bool | None = None,
    data: str | os.PathLike | None = None,
    embeddings: str = "int8",
    level: str = "ort",
    seq_len: int = 512,
    samples: int = 32,
    accuracy_level: int = 4,
    threads: int | None = None,
    statistics: tuple[dict, int] | None = None,
    stages: int = 1,
    int8_layers: int | None = None,
    float_zero_points: bool = False,
    tune_steps: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> LLMQuantizeResult:
    """Quantize the LLM folder ``folder`` into ``output`` (module docstring).

    ``statistics``: what ``calibrate.collect`` returned for this folder and ``data`` (to
    quantize one folder several ways on one calibration pass). ``stages`` > 1: sequential
    calibration; ``int8_layers``: that many body MatMuls kept at 8 bits (None: ``INT8_SHARE`` of
    them with calibration text, none without); ``float_zero_points``:
    asymmetric ``MatMulNBits`` grids with float zero points; ``tune_steps``: that many steps
    of end-to-end tuning of the block scales against the float model on ``data`` (``tune.py``)."""
    start = time.perf_counter()
    _check_options(mode, block_size, method, embeddings, level, stages, int8_layers)
    src, out = Path(folder), Path(output)
    config = llm.read_config(src)
    check_output(out, src)
    text = read_text(data) if data is not None else None
    bits = MODES[mode]
    notes: list[str] = []
    source = {"file": str(data)} if text is not None else None
    sample = text is None and method != "rtn" and bits == 4
    tune.check_tuning(tune_steps, has_text=text is not None or sample)
    if sample:
        text = sampled.sampled_text(
            src, windows=samples, seq_len=seq_len, seed=0, threads=threads, progress=progress
        )
        source = {"sampled": samples, "temperature": sampled.TEMPERATURE, "seed": 0}
        notes.append(
            f"no calibration text: {samples} windows sampled from the model itself "
            "(give `data`, a text file of the domain it will serve, to calibrate on that)"
        )
    if text is None and method != "rtn":
        notes.append(
            "no calibration text: weights rounded to nearest (RTN); give `data` (a text file) "
            "for activation-aware scales, clip search and GPTQ"
        )
        method = "rtn"
    model = load(src / llm.MODEL_FILE)
    size_before = _size(src)
    nodes = calibrate.quantizable_matmuls(model)
    head = [n for n in nodes if const_array(n.inputs[1]).shape[1] == config.vocab_size]
    body = [n for n in nodes if n not in head]
    stats: dict[str, calibrate.InputStats] = {}
    tokens = 0
    if text is not None and method != "rtn" and statistics is not None:
        stats, tokens = statistics
    elif text is not None and method != "rtn":
        stats, tokens = calibrate.collect(
            src, model, nodes, text, seq_len=seq_len, samples=samples, threads=threads
        )
        if not any(st.split for st in stats.values()):
            notes.append(
                "the calibration text fills one window: methods judged on the text they fit"
            )
    weights = {n.name: const_array(n.inputs[1]).astype(np.float32).copy() for n in nodes}
    cost: dict[str, float] = {}
    wide: set[str] = set()
    if int8_layers is None:
        int8_layers = round(INT8_SHARE * len(body)) if text is not None and method != "rtn" else 0
    if bits == 4 and int8_layers > 0 and text is not None:
        cost = sensitivity.measure(
            src,
            model,
            body,
            text,
            block_size=block_size,
            symmetric=symmetric,
            threads=threads,
            progress=progress,
        )
        wide = sensitivity.choose(cost, int8_layers)
    elif bits == 4 and int8_layers > 0:
        wide = _most_sensitive(body, weights, int8_layers, block_size)

    # AWQ scales, group by group from the last: a fold into a fused gate|up weight must land
    # before that weight's own group is searched.
    group_scale: dict[str, np.ndarray] = {}
    group_alpha: dict[str, float] = {}
    candidates = _candidates(method, act_order)
    standard = level == "standard"
    # MatMulNBits takes float zero points (4 bits on CPU); DequantizeLinear integer ones only
    float_zp = float_zero_points and not standard and not symmetric and bits == 4
    unscaled_groups = 0  # groups whose α the candidates' held-out error turned down (auto)
    judged: dict[str, dict[str, float]] = {}  # node → its candidates' errors as it is quantized

    def _judge(group, st, s) -> tuple[float, dict[str, dict[str, float]]]:
        """The group's held-out error after each member's best candidate, and the errors."""
        errs = {}
        for n in group:
            nb = 8 if n.name in wide else bits
            form = zero_point_form(symmetric=symmetric or nb == 8, float_zero_point=float_zp)
            kinds = ("clip",) if nb > bits else candidates
            errs[n.name] = held_out_errors(
                weights[n.name], st, s, candidates=kinds, bits=nb, block_size=block_size, form=form
            )
        return sum(min(e.values()) for e in errs.values()), errs

    if method in ("awq", "auto") and stats:
        order = {n.name: i for i, n in enumerate(model.graph)}
        groups: dict[str, list[ir.Node]] = {}
        for n in body:
            groups.setdefault(n.inputs[0].name, []).append(n)
        for name, group in sorted(groups.items(), key=lambda kv: -order[kv[1][0].name]):
            st, x = stats[name], group[0].inputs[0]
            k = weights[group[0].name].shape[0]
            fold = awq.find_fold(x, group, k)
            if fold is None:
                continue
            h_fit, h_eval = (st.hessian(0), st.hessian(1)) if st.split else (st.hessian(),) * 2
            alpha, s, _ = awq.search(
                [weights[n.name] for n in group],
                h_fit,
                h_eval,
                st.mean_abs(),
                bits=bits,
                block_size=block_size,
                symmetric=symmetric,
                float_zero_point=float_zp,
            )
            if alpha > 0 and method == "auto":
                # α was searched with rounding to nearest; it stays only if it also lowers the
                # group's held-out error after the candidates that will quantize it
                scaled, scaled_errors = _judge(group, st, s)
                unscaled, unscaled_errors = _judge(group, st, None)
                if unscaled <= scaled:
                    alpha, unscaled_groups = 0.0, unscaled_groups + 1
                judged.update(unscaled_errors if alpha == 0 else scaled_errors)
            if alpha > 0:
                awq.apply_fold(fold, s, weights)
                group_scale[name], group_alpha[name] = s, float(alpha)

    graph = model.graph
    layers: list[LayerReport] = []
    head_bits = EMBEDDINGS[embeddings]
    todo = [(n, 8 if n.name in wide else bits) for n in body]
    todo += [(n, head_bits) for n in head if head_bits is not None]
    stage_of = _stages(body, stages) if stats and stages > 1 else {}
    if stage_of:  # the float graph computes with the AWQ-folded weights from here on
        for n in body:
            n.inputs[1].const_value = ir.tensor(weights[n.name], name=n.inputs[1].name)
    stage, stage_stats = 0, {}
    for i, (node, nb) in enumerate(todo):
        x = node.inputs[0]
        is_head = node in head
        w, st, s = weights[node.name], stats.get(x.name), group_scale.get(x.name)
        if stage_of.get(node.name, 0) > 0:
            if stage_of[node.name] != stage:  # inputs through the layers quantized so far
                stage = stage_of[node.name]
                mine = [n for n in body if stage_of[n.name] == stage]
                stage_stats, _ = calibrate.collect(
                    src, model, mine, text, seq_len=seq_len, samples=samples, threads=threads
                )
            st = stage_stats[x.name]  # statistics of the folded input x/s: weights diag(s)·w
            w, s = w if s is None else (w * s[:, None]).astype(np.float32), None
        blocks, kept, errors, rel = quantize_weight(
            w,
            st,
            s,
            bits=nb,
            block_size=block_size,
            symmetric=symmetric or nb == 8,
            float_zero_point=float_zp,
            candidates=("clip",) if (is_head or nb > bits) and method != "rtn" else candidates,
            errors=None if stage_of else judged.get(node.name),
        )
        base = node.name or f"matmul_{i}"
        if standard:
            new_nodes, y = nbits.dq_matmul(graph, x, blocks, name=base)
        else:
            new_nodes, y = nbits.matmul_nbits(
                graph, x, blocks, name=base, accuracy_level=accuracy_level
            )
        swap_node(graph, node, new_nodes, y)
        w = weights[node.name]
        layers.append(
            LayerReport(
                node.name,
                w.shape[0],
                w.shape[1],
                nb,
                kept,
                group_alpha.get(x.name, 0.0),
                rel,
                errors,
                cost.get(node.name),
            )
        )
        if progress:
            progress(i + 1, len(todo))
    if head_bits is not None:
        for node in _embedding_tables(model, config.vocab_size):
            table = const_array(node.inputs[0])
            bsz = _table_block(table.shape[1], block_size)
            if bsz is None:
                notes.append(f"{node.name}: width {table.shape[1]} has no block size: kept float")
                continue
            sym = head_bits == 8 or symmetric
            scale, zp = block_grid(table.T, bits=head_bits, block_size=bsz, symmetric=sym)
            codes = codes_on_grid(table.T, scale, zp, head_bits, bsz)
            blocks = to_blocks(codes, scale, zp, head_bits, bsz)
            new_nodes, y = nbits.gather_block_quantized(
                graph, node.inputs[1], blocks, name=node.name or "embed", standard=standard
            )
            swap_node(graph, node, new_nodes, y)
    remove_unused_initializers(graph)
    tuning = None
    if tune_steps:
        options = tune.TuneOptions(tune_steps, seq_len, samples, threads=threads)
        tuning = tune.tune_model(
            model,
            src,
            text,
            options,
            progress=(lambda i, n, _loss: progress(i, n)) if progress else None,
        )
        if not tuning.kept:
            notes.append(
                f"tuning did not lower the held-out KL ({tuning.held_out_before:.4g} → "
                f"{tuning.held_out_after:.4g} nats/token): the scales are kept as quantized"
            )
    if standard:
        model, upgraded = at_opset(model, nbits.STANDARD_OPSET, "DequantizeLinear with blocks")
        notes += upgraded
    else:
        model.opset_imports.setdefault(nbits.MS_DOMAIN, 1)
    quantization = {
        "mode": mode,
        "bits": bits,
        "block_size": block_size,
        "symmetric": symmetric,
        "method": method,
        "methods_kept": _count(layers[: len(body)]),
        "awq_groups": len(group_scale),
        "awq_groups_unscaled": unscaled_groups,
        "int8_layers": len(wide),
        "embeddings": embeddings,
        "format": "DequantizeLinear+MatMul" if standard else "MatMulNBits",
        "calibration": {**source, "tokens": tokens} if tokens and source else None,
    }
    if tuning is not None:
        quantization["tuning"] = tune.record(tuning)
    new_config = replace(
        config,
        quantization=quantization,
        level="standard" if standard and config.level == "standard" else "ort",
    )
    write_folder(src, out, model, new_config)
    return LLMQuantizeResult(
        str(out),
        mode,
        method,
        block_size,
        symmetric,
        level,
        embeddings,
        layers,
        notes,
        tokens,
        size_before,
        _size(out),
        time.perf_counter() - start,
        tuning,
    )


def _most_sensitive(body, weights, count: int, block_size: int) -> set[str]:
    """Without calibration text: the ``count`` body MatMuls with the largest relative weight
    error rounded to nearest at 4 bits (``sensitivity.py`` measures it end to end with text)."""
    score = {}
    for n in body:
        w = weights[n.name]
        w_hat = sensitivity.rounded(w, bits=4, block_size=block_size, symmetric=False)
        score[n.name] = float(np.sum((w_hat - w) ** 2) / max(np.sum(w * w), 1e-30))
    return sensitivity.choose(score, count)


def _stages(body: list[ir.Node], count: int) -> dict[str, int]:
    """``{MatMul name: stage}``: the body in graph order cut into ``count`` consecutive runs."""
    count = min(count, len(body))
    return {n.name: i * count // len(body) for i, n in enumerate(body)}


def _count(layers: list[LayerReport]) -> dict[str, int]:
    out: dict[str, int] = {}
    for layer in layers:
        out[layer.method] = out.get(layer.method, 0) + 1
    return out


def _size(folder: Path) -> int:
    return sum(
        f.stat().st_size
        for f in (folder / llm.MODEL_FILE, folder / (llm.MODEL_FILE + ".data"))
        if f.exists()
    )
