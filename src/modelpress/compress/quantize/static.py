"""Static (full) int8: activations and weights in 8 bits, calibrated on data, in standard QDQ form.

The algorithm, in order: exact pre-rewrites (depthwise channels padded for the fast kernel, average
pools and stray affines as Convs: ``padding``, ``rewrites``); on attention graphs, activation
outliers moved into the weights (``smoothing``); the plan (``plan``); one calibration pass that
observes every tensor any plan may wrap, the inputs' Hessians for GPTQ and the inputs' means for
bias correction; the classifier-head policy (``heads``); weights rounded (GPTQ, or to nearest) in
the target CPU's format (``pairs``); then a builder that emits the QDQ graph (``qdq``) for any set
of float layers, with the bias shift measured at the output layers corrected.

Formats follow what x86 int8 kernels are fast for: uint8 asymmetric activations, int8 symmetric
per-channel weights, int32 biases at ``scale_x · scale_w``.
"""

from __future__ import annotations

from modelpress.compress.quantize import (
    bias_correction,
    calibration,
    dynamic,
    gptq,
    padding,
    smoothing,
)
from modelpress.compress.quantize.heads import HEAD_TOLERANCE, head_candidates, head_input_errors
from modelpress.compress.quantize.layers import WEIGHT_INPUT
from modelpress.compress.quantize.modes import Built, Mode, Options, Prepared, register
from modelpress.compress.quantize.observers import get_observer
from modelpress.compress.quantize.ops import eligible
from modelpress.compress.quantize.plan import plan
from modelpress.compress.quantize.qdq import apply
from modelpress.compress.quantize.rewrites import AffinesAsConvs, PoolsAsConvs, Reversible
from modelpress.compress.quantize.selection import observable
from modelpress.errors import OptionError
from modelpress.ir.graph import remove_unused_initializers

# The calibration batches that measured bias correction and the head policy average over (kept in
# memory when the calibration data is a one-shot iterator).
BIAS_BATCHES = 4


@register
class StaticMode(Mode):
    name = "static"
    order = 0
    help = "int8 activations and weights, calibrated (CNNs, transformers)"
    needs_calibration = True
    uses_observer = True
    nothing_to_quantize = (
        "it quantizes Conv, Gemm and MatMul with constant weights, and the ops between them"
    )

    def int8_layers(self, model, options: Options) -> bool:
        return any(eligible(n) and n.op_type in WEIGHT_INPUT for n in model.graph)

    def prepare(self, model, cal, opt: Options, progress) -> Prepared:
        if cal is None:
            raise OptionError("static mode needs calibration data (`calibration`)")
        symmetric = opt.symmetric_activations
        # the activation format decides which ops join the chain (Relu folds, HardSigmoid/HardSwish)
        formats = {"asymmetric": not symmetric, "activations": opt.activation_dtype}
        notes = []
        model, padded = padding.pad_depthwise(model)
        if padded:
            notes.append(
                f"{padded} depthwise Conv(s) padded to a multiple of 16 channels (int8 kernel)"
            )
        # (with symmetric activations no Relu folds into the Convs: each piece would add a float Relu)
        rewrites: list[Reversible] = [PoolsAsConvs()] + ([] if symmetric else [AffinesAsConvs()])
        made: dict[str, dict[str, str]] = {}  # rewrite → {node it made: float node it stands for}
        for rw in rewrites:
            model, made[rw.name] = rw.forward(model)
        pools = frozenset(made[PoolsAsConvs.name])

        def as_made(names: frozenset[str]) -> frozenset[str]:
            """Float node names (the user's, the budget's) and the nodes made for them."""
            return names | {new for d in made.values() for new, old in d.items() if old in names}

        if opt.smooth and smoothing.attention_like(model):
            # one int8 scale per activation tensor cannot hold a transformer's outlier channels
            full = plan(model, **formats)
            by = {n.name: n for n in model.graph}
            linear = [by[n] for n in full.layers if by[n].op_type in ("Gemm", "MatMul")]
            factors, n_inputs = smoothing.calibrate(
                model, linear, cal, per_channel=opt.per_channel, progress=progress
            )
            if factors:
                model = smoothing.smooth(model, factors)
                notes.append(
                    f"activation outliers moved into weights (smoothing) for {len(factors)} of {n_inputs} input(s)"
                )
        full = plan(model, **formats)
        obs_cls = get_observer(opt.method)
        # every tensor any plan may wrap (the budget's plans exclude layers), not just the full plan's
        observed = sorted(set(full.observed) | observable(model))
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
        # (not a layer the user keeps in float, by its float name: every node made for it)
        kept = as_made(opt.exclude)
        rounding = [n for n in weighted if n.name not in pools and n.name not in kept]
        hessians = gptq.attach(rounding, observers) if opt.gptq else {}
        calibration.collect(model, cal, observers, progress=progress)
        qparams = {t: obs[0].qparams() for t, obs in observers.items() if t in set(observed)}
        measured = bias_correction.last_layers(model, [by[n] for n in full.layers])
        # a few calibration batches, kept for what measures on them below
        candidates = [h for h in head_candidates(model) if h in full.layers and h not in kept]
        replay = (
            [b.feeds for b in cal.batches(model, limit=BIAS_BATCHES)]
            if candidates or (opt.bias_correction and measured)
            else []
        )

        # A classifier head stays float when rounding its input to 8 bits would move its outputs
        # by more than HEAD_TOLERANCE of their spread across the samples (beyond the mean shift,
        # when bias correction takes that out), and float inputs are what it would then read.
        moved = head_input_errors(
            model, candidates, qparams, full.tensors, replay, centred=opt.bias_correction
        )
        heads = frozenset(h for h, e in moved.items() if e > HEAD_TOLERANCE)
        if heads:
            wrapped = plan(model, heads=heads, **formats).tensors
            heads = frozenset(h for h in heads if by[h].inputs[0].name not in wrapped)
        notes += [
            f"classifier head {h} kept in float: 8-bit inputs moved its outputs by {moved[h]:.1%} "
            f"of their spread on the calibration data (over {HEAD_TOLERANCE:.0%}); "
            "it is a negligible part of the work"
            for h in sorted(heads)
        ]
        rounding = [n for n in rounding if n.name not in heads]
        rounded = gptq.round_layers(
            rounding,
            hessians,
            per_channel=opt.per_channel,
            pair_safe=opt.pair_safe,
            progress=progress,
        )
        if hessians:
            notes.append(gptq.note(len(rounded), len(rounding)))
        deltas = (
            bias_correction.shifts(
                weighted,
                means,
                per_channel=opt.per_channel,
                rounded=rounded,
                pair_safe=opt.pair_safe,
            )
            if opt.bias_correction
            else None
        )

        # Weight rounding's shift (``deltas``) is known ahead. What quantized activations upstream
        # add to it is measured, on a few calibration batches, at the last weighted layers (the
        # ones that write the outputs), where it moves the result itself. Not at every layer at
        # once: each layer's measured shift includes what its upstream layers pass on, so
        # correcting all of them would count that shift once per layer downstream.
        bc_batches = replay if opt.bias_correction and measured else []
        float_means = (
            bias_correction.output_means(model, measured, bc_batches) if bc_batches else {}
        )
        emit = {"per_channel": opt.per_channel, "rounded": rounded, "pair_safe": opt.pair_safe}

        def build(exclude: frozenset[str]) -> Built:
            exclude = as_made(exclude)
            p = plan(model, exclude=exclude, heads=heads, **formats)
            # (a float head has no weight rounding to correct, only the shift measured below)
            corr = {k: v for k, v in (deltas or {}).items() if k not in p.float_heads}
            q = apply(model, p, qparams, bias_deltas=corr, **emit)
            layers = [by[n] for n in p.layers + p.float_heads if n in by and by[n] in measured]
            if float_means and layers:
                for k, d in bias_correction.measured_shifts(
                    float_means, q, layers, bc_batches
                ).items():
                    corr[k] = corr.get(k, 0.0) + d
                q = apply(model, p, qparams, bias_deltas=corr, **emit)
            for rw in rewrites:  # what stays float goes back to its float form
                rw.inverse(q.graph, set(made[rw.name]) - set(p.layers))
            tables = dynamic.tables(q.graph, exclude)  # int8 rows: most of a transformer's file
            remove_unused_initializers(q.graph)
            pairs = {name: (by[name].outputs[0].name,) * 2 for name in tables}
            for name in p.layers:
                y = by[name].outputs[0].name
                fl = p.tensors.get(y, y)
                # a wrapped graph output keeps its name on the DQ (qdq.apply)
                wrapped = y in p.tensors and y not in p.requantized_outputs
                pairs[name] = (fl, f"{y}_dequantized" if wrapped else y)
            return Built(q, p.layers + tables, pairs, reference=model)

        tables = [n.name for n in dynamic.table_layers(model.graph)]
        return Prepared(build, full.layers + tables, notes)
