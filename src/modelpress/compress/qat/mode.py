"""Quantization-aware training as a quantization mode: ``quantize(model, mode="qat", ...)``.

The mode runs static mode first (same plan, same observers, so the same places and formats and the
observers' scales to start from; GPTQ and bias correction off: training does their work), turns
its QDQ graph into a fake-quantized trainable module (``fakequant``), trains it on the calibration
data (its labels and/or the float model as teacher, ``Options.train``), and writes the trained
values back into that same QDQ graph. ``bits=4``: weights on 16 levels (w4a8), in int8 containers.
"""

from __future__ import annotations

from dataclasses import replace

from modelpress.compress.quantize.modes import Built, Options, Prepared, register
from modelpress.compress.quantize.static import StaticMode
from modelpress.errors import OptionError, require


@register
class QatMode(StaticMode):
    """Static mode's plan, observers and int8 forms, then training: it needs what static mode
    needs (calibration data, an observer) and writes the same int8 layers."""

    name = "qat"
    order = 5
    help = "static int8 (or w4a8 with --bits 4) fine-tuned with fake quantization on the data"
    nothing_to_quantize = (
        "it trains what static mode quantizes: Conv, Gemm and MatMul with constant weights"
    )

    def prepare(self, model, cal, opt: Options, progress) -> Prepared:
        require("torch", extra="torch", purpose="quantization-aware training")
        from modelpress.compress.qat.train import train_qdq

        if cal is None:
            raise OptionError("qat mode needs training data (data)")
        if opt.bits not in (8, 4):
            raise OptionError(f"qat: {opt.bits}-bit weights; choose 8 or 4 (w4a8)")
        static = super().prepare(
            model, cal, replace(opt, gptq=False, bias_correction=False, bits=8), progress
        )
        start = static.build(opt.exclude)
        trained, result = train_qdq(model, start.model, cal, opt, progress)
        notes = static.notes + [
            f"quantization-aware training: {result.steps} steps, loss {result.first_loss:.4g} → {result.final_loss:.4g}"
            if result.first_loss is not None and result.final_loss is not None
            else f"quantization-aware training: {result.steps} steps"
        ]
        if opt.bits == 4:
            notes.append(
                "4-bit weights (16 levels) are stored in int8 containers: accuracy of w4a8, size of int8"
            )

        def build(exclude: frozenset[str]) -> Built:
            if exclude != opt.exclude:
                raise OptionError(
                    "qat trains one set of quantized layers: an accuracy budget is not supported, exclude layers instead"
                )
            return Built(trained, start.layers, start.pairs, notes=[], reference=start.reference)

        return Prepared(build, static.candidates, notes, training=result)
