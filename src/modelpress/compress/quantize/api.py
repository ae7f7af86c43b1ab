"""``quantize()``: one typed entry point for every quantization mode.

The float model is optimized first (``modelpress.optimize(level=2)``: BatchNorm folded, fusions
done, so the quantized graph has the shapes int8 kernels want), calibrated once, and then built by
the mode's builder, a function of the set of layers to keep in float, so the accuracy-budget
search can rebuild it cheaply. Modes are looked up in ``MODES``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from modelpress.compress.quantize import (
    bias_correction,
    calibration,
    dynamic,
    float16,
    padding,
    sensitivity,
    static,
    weight_only,
)
from modelpress.compress.quantize import gptq as gptq_mod
from modelpress.compress.quantize import smoothing as smoothing_mod
from modelpress.compress.quantize.calibration import CalibrationSet, ImagePreprocess, Progress
from modelpress.compress.quantize.layers import WEIGHT_INPUT
from modelpress.compress.quantize.observers import get_observer
from modelpress.errors import InputError, OptionError
from modelpress.ir.graph import remove_unused_initializers
from modelpress.ir.match import const_array
from modelpress.ir.opset import at_opset

Metric = Callable[[sensitivity.Runner], float]
# Measured bias correction (static): the calibration batches it averages over (kept in memory
# when the calibration data is a one-shot iterator).
BIAS_BATCHES = calibration.REPLAY
# The oldest opset int8 needs: DequantizeLinear's axis (per-channel scales) came in 13,
# DynamicQuantizeLinear in 11. An older model is upgraded first, and the result says so.
INT8_OPSET = {"per-channel": 13, "per-tensor": 11}


@dataclass(frozen=True)
class Options:
    method: str = "minmax"
    per_channel: bool = True
    bits: int = 8
    block_size: int = 32
    activation_dtype: str = "uint8"
    symmetric_activations: bool = False
    bias_correction: bool = True
    smooth: bool = True
    gptq: bool = True
    exclude: frozenset[str] = frozenset()  # the user's float layers: not calibrated for rounding


@dataclass
class Built:
    """What a mode's builder makes for one set of float layers."""

    model: ir.Model
    layers: list[str]  # the layers quantized
    pairs: dict[str, tuple[str, str]]  # layer → (float tensor, quantized tensor) to compare
    notes: list[str] = field(default_factory=list)
    # the float model that ``layers`` and ``pairs`` name, when the mode rewrote it (exactly) first
    reference: ir.Model | None = None


@dataclass
class QuantizeResult:
    model: ir.Model
    mode: str
    method: str | None
    layers: list[sensitivity.LayerReport]
    seconds: float
    size_before: int
    size_after: int
    notes: list[str] = field(default_factory=list)
    accuracy: sensitivity.BudgetResult | None = None
    output_error: float | None = None  # relative error of the outputs on the calibration data

    def to_dict(self) -> dict:
        return {
            "mode": self.mode,
            "method": self.method,
            "seconds": round(self.seconds, 3),
            "size_before": self.size_before,
            "size_after": self.size_after,
            "output_error": self.output_error,
            "notes": self.notes,
            "accuracy": self.accuracy.to_dict() if self.accuracy else None,
            "layers": [layer.to_dict() for layer in self.layers],
        }


Builder = Callable[[frozenset[str]], Built]
# A mode may rank layers by sensitivity more cheaply than quantizing them one at a time.
Ranker = Callable[[list[dict[str, np.ndarray]]], dict[str, float]]
# A mode prepares (calibrates) and returns its builder, the layers it can quantize, and notes.
ModeFn = Callable[
    [ir.Model, "CalibrationSet | None", Options, "Progress | None"],
    tuple[Builder, list[str], list[str], Ranker | None],
]


def _node_outputs(model: ir.Model, names: list[str]) -> dict[str, tuple[str, str]]:
    """Each layer's first output that is there (an LSTM may leave its ``Y`` out), to compare."""
    by = {n.name: n for n in model.graph}
    out = {}
    for name in names:
        y = next((v.name for v in by[name].outputs if v.name), None) if name in by else None
        if y:
            out[name] = (y, y)
    return out


def _static(model, cal, opt: Options, progress):
    if cal is None:
        raise OptionError("--mode static needs calibration data (--calib)")
    symmetric = opt.symmetric_activations
    # the activation format decides which ops join the chain (Relu folds, HardSigmoid/HardSwish)
    formats = {"asymmetric": not symmetric, "activations": opt.activation_dtype}
    notes = []
    model, padded = padding.pad_depthwise(model)
    if padded:
        notes.append(
            f"{padded} depthwise Conv(s) padded to a multiple of 16 channels (int8 kernel)"
        )
    model, pools = static.pools_as_convs(model)
    # (with symmetric activations no Relu folds into the Convs: each piece would add a float Relu)
    model, affines = static.affines_as_convs(model) if not symmetric else (model, {})
    if opt.smooth and _attention_like(model):
        # one int8 scale per activation tensor cannot hold a transformer's outlier channels
        full = static.plan(model, **formats)
        by = {n.name: n for n in model.graph}
        linear = [by[n] for n in full.layers if by[n].op_type in ("Gemm", "MatMul")]
        factors, n_inputs = smoothing_mod.calibrate(
            model, linear, cal, per_channel=opt.per_channel, progress=progress
        )
        if factors:
            model = smoothing_mod.smooth(model, factors)
            notes.append(
                f"activation outliers moved into weights (smoothing) for {len(factors)} of {n_inputs} input(s)"
            )
    full = static.plan(model, **formats)
    obs_cls = get_observer(opt.method)
    # every tensor any plan may wrap (the budget's plans exclude layers), not just the full plan's
    observed = sorted(set(full.observed) | static.observable(model))
    observers: dict[str, list] = {
        t: [obs_cls(dtype=opt.activation_dtype, symmetric=symmetric)] for t in observed
    }
    by = {n.name: n for n in model.graph}
    weighted = [by[n] for n in full.layers if by[n].op_type in WEIGHT_INPUT]
    means = {}
    if opt.bias_correction:
        for node in weighted:
            cm = bias_correction.ChannelMean(bias_correction.input_mean_axis(node))
            means[node.name] = cm
            observers.setdefault(node.inputs[0].name, []).append(cm)
    # (not a pool written as a Conv: its equal weights 1/k² are exact on the int8 grid)
    # (not a layer the user keeps in float; an affine by its float name is every Conv it became)
    kept = opt.exclude | {conv for conv, mul in affines.items() if mul in opt.exclude}
    rounding = [n for n in weighted if n.name not in pools and n.name not in kept]
    hessians = gptq_mod.attach(rounding, observers) if opt.gptq else {}
    calibration.collect(model, cal, observers, progress=progress)
    qparams = {t: obs[0].qparams() for t, obs in observers.items() if t in set(observed)}
    measured = bias_correction.last_layers(model, [by[n] for n in full.layers])
    # a few calibration batches, kept for what measures on them below
    candidates = [h for h in static.head_candidates(model) if h in full.layers and h not in kept]
    replay = (
        [b.feeds for b in cal.batches(model, limit=BIAS_BATCHES)]
        if candidates or (opt.bias_correction and measured)
        else []
    )

    # A classifier head stays float when rounding its input to 8 bits would move its outputs by
    # more than HEAD_TOLERANCE of their spread across the samples (beyond the mean shift, when
    # bias correction takes that out), and float inputs are what it would then read.
    moved = static.head_input_errors(
        model, candidates, qparams, full.tensors, replay, centred=opt.bias_correction
    )
    heads = frozenset(h for h, e in moved.items() if e > HEAD_TOLERANCE)
    if heads:
        wrapped = static.plan(model, heads=heads, **formats).tensors
        heads = frozenset(h for h in heads if by[h].inputs[0].name not in wrapped)
    notes += [
        f"classifier head {h} kept in float: 8-bit inputs moved its outputs by {moved[h]:.1%} "
        f"of their spread on the calibration data (over {HEAD_TOLERANCE:.0%}); "
        "it is a negligible part of the work"
        for h in sorted(heads)
    ]
    rounding = [n for n in rounding if n.name not in heads]
    rounded = gptq_mod.round_layers(
        rounding, hessians, per_channel=opt.per_channel, progress=progress
    )
    if hessians:
        notes.append(gptq_mod.note(len(rounded), len(rounding)))
    deltas = (
        bias_correction.shifts(weighted, means, per_channel=opt.per_channel, rounded=rounded)
        if opt.bias_correction
        else None
    )

    # Weight rounding's shift (``deltas``) is known ahead. What quantized activations upstream add
    # to it is measured, on a few calibration batches, at the last weighted layers (the ones that
    # write the outputs: a classifier, a segmentation head), where it moves the result itself.
    # Not at every layer at once: each layer's measured shift includes what its upstream layers
    # pass on, so correcting all of them counts that shift once per layer (output error x7 on a
    # 30-layer CNN); layer by layer would take a pass over the data per layer.
    bc_batches = replay if opt.bias_correction and measured else []
    float_means = bias_correction.output_means(model, measured, bc_batches) if bc_batches else {}

    def build(exclude: frozenset[str]) -> Built:
        # an affine excluded by its float name excludes every Conv it became
        exclude = exclude | {conv for conv, mul in affines.items() if mul in exclude}
        p = static.plan(model, exclude=exclude, heads=heads, **formats)
        # (a float head has no weight rounding to correct, only the shift measured below)
        corr = {k: v for k, v in (deltas or {}).items() if k not in p.float_heads}
        kw = {"per_channel": opt.per_channel, "rounded": rounded}
        q = static.apply(model, p, qparams, bias_deltas=corr, **kw)
        layers = [by[n] for n in p.layers + p.float_heads if n in by and by[n] in measured]
        if float_means and layers:
            for k, d in bias_correction.measured_shifts(float_means, q, layers, bc_batches).items():
                corr[k] = corr.get(k, 0.0) + d
            q = static.apply(model, p, qparams, bias_deltas=corr, **kw)
        static.convs_as_pools(q.graph, pools - set(p.layers))
        static.convs_as_affines(q.graph, set(affines) - set(p.layers))
        tables = dynamic.tables(q.graph, exclude)  # int8 rows: most of a transformer's file
        remove_unused_initializers(q.graph)
        pairs = {name: (by[name].outputs[0].name,) * 2 for name in tables}
        for name in p.layers:
            out = by[name].outputs[0]
            y = out.name
            fl = p.tensors.get(y, y)
            # a wrapped graph output keeps its name on the DQ (static.apply)
            wrapped = y in p.tensors and y not in p.requantized_outputs
            pairs[name] = (fl, f"{y}_dequantized" if wrapped else y)
        return Built(q, p.layers + tables, pairs, reference=model)

    tables = [n.name for n in dynamic.table_layers(model.graph)]
    return build, full.layers + tables, notes, None


# A head whose outputs 8-bit inputs move by more than this share of their spread stays float
# (``static.head_candidates``); measured: 12% cost a DenseNet-style CNN 1.3 points of top-1
# accuracy.
HEAD_TOLERANCE = 0.02


# What each mode quantizes, said when a model has none of it.
NOTHING_TO_QUANTIZE = {
    "static": "it quantizes Conv, Gemm and MatMul with constant weights, and the ops between them",
    "dynamic": "it quantizes MatMul and Gemm with constant weights (transformers); "
    "for Conv layers use --mode static",
    "weight-only": "it quantizes the constant weights of MatMul, Gemm and Conv",
}


def _attention_like(model: ir.Model) -> bool:
    return any(n.op_type in ("Softmax", "LayerNormalization") for n in model.graph)


def _dynamic(model, cal, opt: Options, progress):
    nodes = dynamic.layers(model)
    smoothing = None
    notes = []
    # (as in static mode: a CNN's classifier head has no outlier channels, and lost 2-5 dB to it)
    if cal is not None and opt.smooth and _attention_like(model):
        smoothing, n_inputs = smoothing_mod.calibrate(
            model, nodes, cal, per_channel=opt.per_channel, progress=progress
        )
        if n_inputs:
            notes.append(
                f"activation outliers moved into weights (smoothing) for {len(smoothing)} of {n_inputs} input(s)"
            )

    def build(exclude):
        q, done = dynamic.apply(
            model, per_channel=opt.per_channel, exclude=exclude, smoothing=smoothing
        )
        return Built(q, done, _node_outputs(model, done))

    tables = [n.name for n in dynamic.table_layers(model.graph)]
    return build, [n.name for n in nodes] + tables, notes, None


def _weight_only(model, cal, opt: Options, progress):
    if opt.bits == 4:
        model = weight_only.gemms_as_matmuls(model)
    nodes = weight_only.layers(model)
    gptq, notes = {}, []
    if opt.bits == 4 and opt.gptq:  # error-compensating rounding, on generated inputs if no cal
        gptq, notes = weight_only.gptq_quantize(
            model, cal, block_size=opt.block_size, skip=opt.exclude, progress=progress
        )
    elif opt.gptq and cal is not None:
        gptq, notes = weight_only.gptq_int8(model, cal, skip=opt.exclude, progress=progress)
    if opt.bits == 4:  # 4-bit blocks that GPTQ did not solve, where CNNs lose the most
        convs = [
            n
            for n in nodes
            if n.op_type == "Conv"
            and n.name not in opt.exclude
            and n.name not in gptq
            and weight_only.blockwise(const_array(n.inputs[1]), 1, 4, opt.block_size)
        ]
        if convs:
            notes.append(
                f"{len(convs)} Conv weight(s) at 4 bits rounded to nearest (grouped, too wide "
                "for GPTQ, better rounded, or --no-gptq): CNNs lose the most accuracy here; "
                "--max-accuracy-drop or --exclude keeps Convs at 8 bits"
            )

    def build(exclude):
        # With 4 bits, the budget's fallback for a sensitive layer is 8 bits, not float.
        if opt.bits == 4:
            q, done, notes = weight_only.apply(
                model, bits=4, block_size=opt.block_size, int8_layers=exclude, quantized=gptq
            )
        else:
            q, done, notes = weight_only.apply(
                model, bits=opt.bits, block_size=opt.block_size, exclude=exclude, quantized=gptq
            )
        # (4 bits wrote Gemms as MatMul + Add first: the report compares against that model)
        return Built(q, done, _node_outputs(model, done), notes, reference=model)

    def rank(batches):
        wanted = {n.inputs[0].name for n in nodes if n.op_type in ("MatMul", "Gemm")}
        run = sensitivity.runner(model, outputs=wanted, optimize="disabled")
        scores = dict.fromkeys((n.name for n in nodes), 0.0)
        for feeds in batches:
            got = run(feeds)
            local = weight_only.local_errors(
                model, nodes, got, bits=opt.bits, block_size=opt.block_size, quantized=gptq
            )
            for k, v in local.items():
                scores[k] += v
        if opt.bits == 4:  # a recurrent layer is at 8 bits already: keeping it so changes nothing
            scores.update(dict.fromkeys((n.name for n in weight_only.recurrent_layers(model)), 0.0))
        return scores

    return build, [n.name for n in nodes], notes, rank


def _float16(dtype: str) -> ModeFn:
    def prepare(model, cal, opt, progress):
        names = [n.name for n in model.graph if n.op_type not in float16.KEEP_FLOAT32]

        def build(exclude):
            q, kept = float16.apply(model, dtype=dtype, keep_nodes=exclude)
            done = [n for n in names if n not in set(kept)]
            return Built(q, done, _node_outputs(model, done))

        note = float16.schema_note(model, dtype)
        return build, names, [note] if note else [], None

    return prepare


MODES: dict[str, ModeFn] = {
    "static": _static,
    "dynamic": _dynamic,
    "weight-only": _weight_only,
    "fp16": _float16("fp16"),
    "bf16": _float16("bf16"),
}


def _as_model(model) -> ir.Model:
    from modelpress.ir import from_proto, load
    from modelpress.ir.graph import copy_model

    if isinstance(model, ir.Model):
        return copy_model(model)
    if isinstance(model, (str, os.PathLike)):
        return load(model)
    return from_proto(model)


def accuracy_metric(cal: CalibrationSet, model: ir.Model) -> Metric:
    """Top-1 accuracy of the first output against the labels that come with the calibration data."""

    def metric(run: sensitivity.Runner) -> float:
        hits = total = 0
        for batch in cal.batches(model):
            if batch.labels is None:
                raise InputError(
                    f"{cal.name}: no labels for the accuracy budget (set the labels key)"
                )
            out = next(iter(run(batch.feeds).values()))
            hits += int((np.asarray(out).argmax(axis=-1) == batch.labels).sum())
            total += len(batch.labels)
        return hits / max(total, 1)

    return metric


def quantize(
    model,
    *,
    mode: str = "static",
    calibration=None,
    method: str = "minmax",
    per_channel: bool = True,
    bits: int = 8,
    block_size: int = 32,
    activation_dtype: str = "uint8",
    symmetric_activations: bool = False,
    bias_correction: bool = True,
    smooth: bool = True,
    gptq: bool = True,
    exclude: list[str] | None = None,
    max_accuracy_drop: float | None = None,
    metric: Metric | None = None,
    labels_key: str | None = None,
    batch_size: int = 16,
    calibration_limit: int | None = None,
    image: ImagePreprocess | None = None,
    optimize: bool = True,
    report_layers: bool = True,
    progress: Progress | None = None,
) -> QuantizeResult:
    """Quantize ``model`` (an ``onnx_ir.Model``, path or ``ModelProto``; not modified).

    ``mode``: static | dynamic | weight-only | fp16 | bf16. ``calibration``: an .npz path, a
    directory of .npz files or images (with ``image``), or an iterable of input dicts; required for
    static, used by dynamic and static on attention-like graphs (outlier smoothing, ``smooth``) and by every mode for the error report and the
    accuracy budget. ``max_accuracy_drop`` with ``metric`` (a function of a runner
    ``feeds → outputs`` returning a score, higher is better) or ``labels_key`` (labels in the
    calibration data; top-1 accuracy) keeps the most sensitive layers in float until the drop holds.
    ``gptq``: weights rounded by GPTQ on the calibration data (static int8; weight-only int4, and
    int8 when calibration data is given) instead of to nearest.
    """
    from modelpress.ir import model_bytes
    from modelpress.ir.graph import copy_model
    from modelpress.ir.shapes import with_types

    if mode not in MODES:
        raise OptionError(f"--mode {mode}: choose one of {', '.join(MODES)}")
    get_observer(method)
    if activation_dtype not in ("uint8", "int8"):
        raise OptionError(f"activation type {activation_dtype!r}: choose uint8 or int8")
    if max_accuracy_drop is not None and max_accuracy_drop < 0:
        raise OptionError("--max-accuracy-drop must be at least 0")
    start = time.perf_counter()
    original = _as_model(model)
    size_before = len(model_bytes(original))
    work = copy_model(original)
    if optimize:
        from modelpress.passes import optimize as run_optimizer

        work = run_optimizer(work, level=2).model
    upgraded = []
    work = with_types(work)
    if _int8_candidates(mode, bits, work):  # a model with nothing to quantize keeps its opset
        # (weight-only int8 scales are always per channel)
        scales = "per-channel" if per_channel or mode == "weight-only" else "per-tensor"
        work, upgraded = at_opset(work, INT8_OPSET[scales], f"{scales} int8")
        if upgraded:
            work = with_types(work)
    static.name_nodes(work)
    cal = None
    if calibration is not None:
        cal = CalibrationSet.from_source(
            calibration,
            batch_size=batch_size,
            labels_key=labels_key,
            image=image,
            limit=calibration_limit,
        )
    opt = Options(
        method,
        per_channel,
        bits,
        block_size,
        activation_dtype,
        symmetric_activations,
        bias_correction,
        smooth,
        gptq,
        frozenset(exclude or ()),
    )
    build, candidates, notes, ranker = MODES[mode](work, cal, opt, progress)
    notes = upgraded + notes + _recurrent_note(work, mode)
    if not candidates and mode in NOTHING_TO_QUANTIZE:
        notes.append(f"nothing to quantize in {mode} mode: {NOTHING_TO_QUANTIZE[mode]}")
    # names of the optimized model, or of the layer report (a mode may have rewritten a node)
    unknown = sorted(set(exclude or ()) - {n.name for n in work.graph} - set(candidates))
    if unknown:
        raise OptionError(f"--exclude {unknown[0]}: no node of that name (after optimization)")
    built = build(frozenset(exclude or ()))
    accuracy = None
    if max_accuracy_drop is not None:
        if metric is None:
            if cal is None or labels_key is None:
                raise OptionError(
                    "--max-accuracy-drop needs a metric: labels in the calibration data (--labels-key) or a metric function"
                )
            metric = accuracy_metric(cal, work)
        built, accuracy = _budget(work, build, built, ranker, cal, metric, max_accuracy_drop)
    layers, out_err = [], None
    if report_layers and cal is not None:
        batches = [b.feeds for b in cal.batches(work, limit=2)]
        outputs = {f"output:{v.name}": (v.name, v.name) for v in work.graph.outputs}
        reference = built.reference or work
        try:
            errs = sensitivity.layer_errors(
                reference, built.model, {**built.pairs, **outputs}, batches
            )
            out_err = max((errs[k][1] for k in outputs if k in errs), default=None)
        except Exception as exc:  # noqa: BLE001 - e.g. bf16 graphs that ONNX Runtime's CPU cannot run
            errs = {}
            notes.append(
                f"no error report: ONNX Runtime cannot run the result here ({str(exc).splitlines()[0][:120]})"
            )
        by = {n.name: n for n in reference.graph}
        for name in candidates:
            sq, rel = errs.get(name, (None, None))
            layers.append(
                sensitivity.LayerReport(name, by[name].op_type, name in set(built.layers), sq, rel)
            )
    return QuantizeResult(
        model=built.model,
        mode=mode,
        method=method if mode == "static" else None,
        layers=layers,
        seconds=time.perf_counter() - start,
        size_before=size_before,
        size_after=len(model_bytes(built.model)),
        notes=notes + built.notes,
        accuracy=accuracy,
        output_error=out_err,
    )


def _recurrent_note(model: ir.Model, mode: str) -> list[str]:
    """Integer-activation modes leave recurrent layers float: say so, with their share of the
    weights, so that a small saving on an LSTM model is not a mystery."""
    if mode not in ("static", "dynamic"):
        return []
    nodes = weight_only.recurrent_layers(model)
    if not nodes:
        return []
    total = sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value)
    weights = {id(v): v for n in nodes for v in n.inputs[1:3] if v is not None}  # shared: once
    theirs = sum(a.nbytes for v in weights.values() if (a := const_array(v)) is not None)
    kinds = "/".join(sorted({n.op_type for n in nodes}))
    share = f" ({100 * theirs / max(total, theirs):.0f}% of the weights)" if theirs else ""
    return [
        f"{len(nodes)} {kinds} layer(s) stay float32{share}: standard ONNX has no integer "
        "recurrent op; --mode weight-only stores their weights as int8"
    ]


def _int8_candidates(mode: str, bits: int, model: ir.Model) -> bool:
    """Whether ``mode`` has a layer whose int8 form needs ``INT8_OPSET`` (tables as int8 rows
    need no particular opset)."""
    if mode == "static":
        return any(static.eligible(n) and n.op_type in WEIGHT_INPUT for n in model.graph)
    if mode == "dynamic":
        return bool(dynamic.layers(model))
    return mode == "weight-only" and bits == 8 and bool(weight_only.layers(model))


def _budget(work, build, built, ranker, cal, metric, budget):
    def evaluate(model: ir.Model) -> float:
        return float(metric(sensitivity.runner(model)))

    metric_float = evaluate(work)
    first = (built, evaluate(built.model))
    if metric_float - first[1] <= budget:
        return built, sensitivity.BudgetResult(
            metric_float, first[1], budget, True, [], [(0, first[1])]
        )
    batches = [b.feeds for b in cal.batches(work, limit=2)] if cal is not None else []
    if ranker is not None:
        scores = {k: v for k, v in ranker(batches).items() if k in set(built.layers)}
    else:
        scores = sensitivity.rank_layers(work, built.layers, lambda ex: build(ex).model, batches)
    ranked = sorted(scores, key=scores.get, reverse=True)
    models: dict[int, Built] = {}

    def build_model(exclude: frozenset[str]) -> ir.Model:
        b = build(exclude)
        models[len(exclude)] = b
        return b.model

    model, result = sensitivity.budget_search(
        ranked,
        build_model,
        evaluate,
        metric_float=metric_float,
        budget=budget,
        first=(built.model, first[1]),
    )
    chosen = next((b for b in [built, *models.values()] if b.model is model), built)
    return chosen, result
