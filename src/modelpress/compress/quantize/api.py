"""``quantize()``: one typed entry point for every quantization mode.

The float model is optimized first (``modelpress.optimize(level=2)``: BatchNorm folded, fusions
done, so the quantized graph has the shapes int8 kernels want), calibrated once, and then built by
the mode's builder, a function of the set of layers to keep in float, so the accuracy-budget
search can rebuild it cheaply. Modes are registered objects (``modes.MODES``). The int8 formats
follow the CPU the model is for (``target_cpu``: this one by default); the result is checked the
way it will run (``check``) and says why when it should not be used.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from modelpress.compress.qat import mode as _qat  # noqa: F401  (registers "qat"; torch on use)

# (importing the mode modules registers them, in the order --help lists them)
from modelpress.compress.quantize import dynamic, float16, sensitivity, static, weight_only  # noqa: F401
from modelpress.compress.quantize.calibration import CalibrationSet, ImagePreprocess, Progress
from modelpress.compress.quantize.check import Check, check
from modelpress.compress.quantize.modes import Built, Options, get_mode
from modelpress.compress.quantize.observers import get_observer
from modelpress.compress.quantize.rewrites import name_nodes
from modelpress.errors import InputError, OptionError, renamed
from modelpress.ir import from_proto, load, model_bytes
from modelpress.ir.graph import copy_model
from modelpress.ir.match import const_array
from modelpress.ir.opset import at_opset
from modelpress.ir.shapes import with_types
from modelpress.passes import optimize as run_optimizer
from modelpress.runtime.cpu import TARGET_METADATA_KEY, resolve_target
from modelpress.verify.inputs import generate_inputs
from modelpress.verify.metrics import top1_hits

Metric = Callable[[sensitivity.Runner], float]
# The oldest opset int8 needs: DequantizeLinear's axis (per-channel scales) came in 13,
# DynamicQuantizeLinear in 11. An older model is upgraded first, and the result says so.
INT8_OPSET = {"per-channel": 13, "per-tensor": 11}
# Modes whose integer kernels multiply uint8 activations by int8 weights (the target matters).
U8S8_MODES = ("static", "dynamic", "qat")
# The first calibration batches that the measured bias correction fits (``static.BIAS_BATCHES``):
# the check runs on the ones after them.
CHECK_FROM = static.BIAS_BATCHES


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
    target: str | None = None  # the CPU its int8 formats are for (u8·s8 modes)
    check: Check | None = None  # the outputs as ONNX Runtime runs them here
    training: object = (
        None  # qat: the training run (``compress.train.TrainResult``: the loss curve)
    )

    @property
    def output_error(self) -> float | None:
        """Relative output error as deployed (ONNX Runtime's default optimizations, this CPU)."""
        return self.check.deployed_error if self.check else None

    @property
    def failures(self) -> list[str]:
        """Why the result should not be used (empty when it is fine)."""
        return self.check.failures if self.check else []

    def to_dict(self) -> dict:
        return {
            "mode": self.mode,
            "method": self.method,
            "target": self.target,
            "seconds": round(self.seconds, 3),
            "size_before": self.size_before,
            "size_after": self.size_after,
            "output_error": self.output_error,
            "check": self.check.to_dict() if self.check else None,
            "notes": self.notes,
            "accuracy": self.accuracy.to_dict() if self.accuracy else None,
            "layers": [layer.to_dict() for layer in self.layers],
            "training": self.training.to_dict() if self.training is not None else None,
        }


def _as_model(model) -> ir.Model:

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
            hits += top1_hits(out, batch.labels)
            total += len(batch.labels)
        return hits / max(total, 1)

    return metric


def quantize(
    model,
    *,
    mode: str = "static",
    data=None,
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
    limit: int | None = None,
    image: ImagePreprocess | None = None,
    optimize: bool = True,
    report_layers: bool = True,
    target_cpu: str = "auto",
    dims: dict[str, int] | None = None,
    check_latency: bool = False,
    train=None,
    progress: Progress | None = None,
    calibration=None,
    calibration_limit: int | None = None,
) -> QuantizeResult:
    """Quantize ``model`` (an ``onnx_ir.Model``, path or ``ModelProto``; not modified).

    ``mode``: a registered mode (static | dynamic | weight-only | fp16 | bf16, ...).
    ``data``: the calibration samples: an .npz path, a folder of .npz files or images (with
    ``image``), or an iterable of input dicts (``limit``: the samples read; ``calibration`` and
    ``calibration_limit`` are their old names); required for static, used by dynamic and static on attention-like
    graphs (outlier smoothing, ``smooth``) and by every mode for the error report, the check and
    the accuracy budget. ``max_accuracy_drop`` with ``metric`` (a function of a runner
    ``feeds → outputs`` returning a score, higher is better) or ``labels_key`` (labels in the
    calibration data; top-1 accuracy) keeps the most sensitive layers in float until the drop
    holds, measured as ONNX Runtime runs the model here. ``gptq``: weights rounded by GPTQ on the
    calibration data (static int8; weight-only int4, and int8 when calibration data is given)
    instead of to nearest. ``target_cpu``: auto (this CPU) | vnni | avx2 | arm64 | portable, the
    int8 formats' CPU (``runtime.cpu``). ``dims``: sizes of dynamic dimensions for generated check
    inputs (without calibration data). ``check_latency``: time float and int8 here (static mode
    must be faster). ``train``: qat mode's ``compress.train.TrainConfig``. The result's
    ``failures`` say why it should not be used.
    """

    mode_obj = get_mode(mode)
    get_observer(method)
    if activation_dtype not in ("uint8", "int8"):
        raise OptionError(f"`activation_dtype` {activation_dtype!r}: choose uint8 or int8")
    if max_accuracy_drop is not None and max_accuracy_drop < 0:
        raise OptionError("`max_accuracy_drop` must be at least 0")
    target = resolve_target(target_cpu) if mode in U8S8_MODES else None
    start = time.perf_counter()
    original = _as_model(model)
    size_before = len(model_bytes(original))
    work = copy_model(original)
    if optimize:
        work = run_optimizer(work, level=2).model
    opt = Options(
        method=method,
        per_channel=per_channel,
        bits=bits,
        block_size=block_size,
        activation_dtype=activation_dtype,
        symmetric_activations=symmetric_activations,
        bias_correction=bias_correction,
        smooth=smooth,
        gptq=gptq,
        exclude=frozenset(exclude or ()),
        target=target or "vnni",
        train=train,
    )
    upgraded = []
    work = with_types(work)
    if mode_obj.int8_layers(work, opt):  # a model with nothing to quantize keeps its opset
        # (weight-only int8 scales are always per channel)
        scales = "per-channel" if per_channel or mode == "weight-only" else "per-tensor"
        work, upgraded = at_opset(work, INT8_OPSET[scales], f"{scales} int8")
        if upgraded:
            work = with_types(work)
    name_nodes(work)
    cal = None
    data = renamed(data, calibration, new="data", old="calibration")
    limit = renamed(limit, calibration_limit, new="limit", old="calibration_limit")
    if data is not None:
        cal = CalibrationSet.from_source(
            data,
            batch_size=batch_size,
            labels_key=labels_key,
            image=image,
            limit=limit,
        )
    prepared = mode_obj.prepare(work, cal, opt, progress)
    candidates = prepared.candidates
    notes = upgraded + prepared.notes + _recurrent_note(work, mode)
    if not candidates and mode_obj.nothing_to_quantize:
        notes.append(f"nothing to quantize in {mode} mode: {mode_obj.nothing_to_quantize}")
    # names of the optimized model, or of the layer report (a mode may have rewritten a node)
    unknown = sorted(set(exclude or ()) - {n.name for n in work.graph} - set(candidates))
    if unknown:
        raise OptionError(f"`exclude` {unknown[0]}: no node of that name (after optimization)")
    built = prepared.build(frozenset(exclude or ()))
    accuracy = None
    if max_accuracy_drop is not None:
        if metric is None:
            if cal is None or labels_key is None:
                raise OptionError(
                    "`max_accuracy_drop` needs a metric: labels in the calibration data (`labels_key`) or a metric function"
                )
            metric = accuracy_metric(cal, work)
        built, accuracy = _budget(work, prepared, built, cal, metric, max_accuracy_drop)
    if target is not None and built.layers:
        built.model.metadata_props[TARGET_METADATA_KEY] = target
    batches = [b.feeds for b in cal.batches(work, limit=2)] if cal is not None else []
    layers = _layer_report(work, built, candidates, batches, notes) if report_layers and cal else []
    size_after = len(model_bytes(built.model))
    checked_on = _check_batches(cal, work) if cal is not None else _generated(original, dims)
    checked = check(
        original,
        built.model,
        checked_on,
        mode=mode,
        target=target,
        size_before=size_before,
        size_after=size_after,
        latency_feeds=checked_on[0] if check_latency and checked_on else None,
    )
    return QuantizeResult(
        model=built.model,
        mode=mode,
        method=method if mode_obj.uses_observer else None,
        layers=layers,
        seconds=time.perf_counter() - start,
        size_before=size_before,
        size_after=size_after,
        notes=notes + built.notes + checked.notes,
        accuracy=accuracy,
        target=target,
        check=checked,
        training=prepared.training,
    )


def _check_batches(cal: CalibrationSet, model: ir.Model) -> list[dict[str, np.ndarray]]:
    """Samples to check on that the calibration did not fit: the batches after those the measured
    bias correction averages over; without such, the first batches with noise added (a tenth of
    each float input's spread), since a correction measured on a sample matches it exactly and
    would make any other difference look large."""
    try:
        seen = [b.feeds for b in cal.batches(model, limit=CHECK_FROM + 2)]
    except OptionError:  # a one-shot iterator: only what was kept can be read again
        seen = [b.feeds for b in cal.batches(model, limit=CHECK_FROM)]
    if len(seen) > CHECK_FROM:
        return seen[CHECK_FROM:]
    rng = np.random.default_rng(0)
    return [
        {
            k: (v + rng.standard_normal(v.shape) * 0.1 * float(v.std())).astype(v.dtype)
            if v.dtype.kind == "f" and v.size > 1
            else v
            for k, v in feeds.items()
        }
        for feeds in seen[:2]
    ]


def _generated(model: ir.Model, dims: dict[str, int] | None) -> list[dict[str, np.ndarray]]:
    """Two generated input sets for the check, when the user gave no data (none when the model's
    inputs cannot be generated: the check then says it could not run)."""
    try:
        return [generate_inputs(model, dims=dims, seed=i) for i in range(2)]
    except InputError:
        return []


def _layer_report(work, built: Built, candidates, batches, notes) -> list[sensitivity.LayerReport]:
    """Each candidate layer's SQNR and relative error against the float model, on the reference
    path (ONNX Runtime with optimizations off: fused kernels have no intermediate tensors)."""
    outputs = {f"output:{v.name}": (v.name, v.name) for v in work.graph.outputs}
    reference = built.reference or work
    try:
        errs = sensitivity.layer_errors(reference, built.model, {**built.pairs, **outputs}, batches)
    except Exception as exc:  # noqa: BLE001 - e.g. bf16 graphs that ONNX Runtime's CPU cannot run
        errs = {}
        notes.append(
            f"no error report: ONNX Runtime cannot run the result here ({str(exc).splitlines()[0][:120]})"
        )
    by = {n.name: n for n in reference.graph}
    done = set(built.layers)
    return [
        sensitivity.LayerReport(name, by[name].op_type, name in done, *errs.get(name, (None, None)))
        for name in candidates
    ]


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
        "recurrent op; weight-only mode stores their weights as int8"
    ]


def _budget(work, prepared, built, cal, metric, budget):
    build, ranker = prepared.build, prepared.rank

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
