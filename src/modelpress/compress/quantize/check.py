"""What will run: a quantized model checked the way it is deployed, on this CPU.

Two errors of the outputs against the float model, ``‖f − q‖ / ‖f‖`` over every float output:

- ``reference``: the quantized graph run as written (ONNX Runtime, optimizations off: every
  DequantizeLinear feeds a float op). It is the error the chosen scales imply.
- ``deployed``: both models under ONNX Runtime's default optimizations, as users run them. Q/DQ
  groups then fuse into integer kernels, whose arithmetic is this CPU's.

The two agree within requantization rounding when the kernels compute what the scales say. When
the deployed error is far beyond the reference one (over ``SLACK`` times it, and ``FLOOR`` more),
the CPU's kernels do not (int16 pair sums saturating on x86 without VNNI, say): the model is not
verified, and the difference is the finding. A model is also refused when it fails its mode's
purpose: an integer model larger than the float one, a static int8 model slower than it here
(with a margin over the measurement's spread), outputs with NaNs the float model does not have,
an invalid graph, or outputs that are mostly error (``MAX_ERROR``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from modelpress.compress.quantize import pairs
from modelpress.compress.quantize.sensitivity import Runner, runner
from modelpress.ir.io import invalid
from modelpress.ir.match import const_array
from modelpress.runtime.cpu import int8_capability, is_exact
from modelpress.runtime.measure import compare_latency, top_ops

# The deployed error may exceed the reference error by this factor, plus ``FLOOR``: fused kernels
# round some values to the neighbouring code, and deep networks with squeeze-excite gates carry such
# one-code differences far (half again the reference error on a MobileNetV3-style OCR classifier);
# saturating sums multiply the error by 3 and more.
SLACK = 2.0
FLOOR = 0.005
# Past this relative output error a quantized model's outputs are mostly error, whatever the
# scales imply: it is refused, and an accuracy budget (layers kept float) is the way out.
MAX_ERROR = 0.5
# A static int8 model counts as slower when its median latency is this much over the float one's
# and their interquartile ranges do not overlap.
SLOWER = 1.05


@dataclass
class Check:
    reference_error: float | None
    deployed_error: float | None
    cpu: dict
    target: str | None
    latency: dict | None = None
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        return self.deployed_error is not None and not self.failures

    def to_dict(self) -> dict:
        return {
            "reference_error": self.reference_error,
            "deployed_error": self.deployed_error,
            "verified": self.verified,
            "cpu": self.cpu,
            "target": self.target,
            "latency": self.latency,
            "failures": self.failures,
            "notes": self.notes,
        }


def output_error(run_f: Runner, run_q: Runner, batches: Iterable[dict[str, np.ndarray]]) -> float:
    """``‖f − q‖ / ‖f‖`` over every float output and batch; infinite when the quantized model
    gives a NaN or infinity where the float model does not, or a different shape."""
    s = e = 0.0
    for feeds in batches:
        of, oq = run_f(feeds), run_q(feeds)
        for k, f in of.items():
            f = np.asarray(f)
            if k not in oq or not np.issubdtype(f.dtype, np.floating):
                continue
            q = np.asarray(oq[k]).astype(np.float64)
            if q.shape != f.shape:
                return math.inf
            f = f.astype(np.float64)
            finite = np.isfinite(f)
            if not np.isfinite(q[finite]).all():
                return math.inf
            s += float(np.sum(f[finite] ** 2))
            e += float(np.sum((f[finite] - q[finite]) ** 2))
    return math.sqrt(e / s) if s > 0 else (0.0 if e == 0 else math.inf)


def saturating_layers(model: ir.Model) -> list[str]:
    """The nodes whose int8 weight codes have a pair the kernels of CPUs without VNNI overflow
    (``pairs``): a Conv, MatMul or Gemm reading ``DequantizeLinear`` of int8 codes, or a
    ``MatMulInteger`` (whose ``W [K, N]`` reduces over its rows)."""
    out = []
    for node in model.graph:
        if node.op_type not in ("Conv", "MatMul", "Gemm", "MatMulInteger") or len(node.inputs) < 2:
            continue
        w = node.inputs[1]
        dq = w.producer() if w is not None else None
        codes = (
            const_array(dq.inputs[0])
            if dq is not None and dq.op_type == "DequantizeLinear"
            else const_array(w)
        )
        if codes is None or codes.dtype != np.int8 or codes.ndim < 2:
            continue
        if node.op_type == "MatMulInteger":
            node = ir.node("MatMul", [node.inputs[0], w], name=node.name)
        if pairs.worst_pair(node, codes) > pairs.PAIR_LIMIT:
            out.append(node.name)
    return out


def check(
    float_model: ir.Model,
    quantized: ir.Model,
    batches: list[dict[str, np.ndarray]],
    *,
    mode: str,
    target: str | None,
    size_before: int,
    size_after: int,
    latency_feeds: dict[str, np.ndarray] | None = None,
) -> Check:
    """Check ``quantized`` against ``float_model`` on ``batches`` as described above; with
    ``latency_feeds``, also time both models here (static int8 must be faster)."""
    here = int8_capability()
    out = Check(None, None, here.to_dict(), target)
    integer = mode not in ("fp16", "bf16")
    if integer and size_after > size_before:
        out.failures.append(
            f"the quantized file is larger than the float one ({size_after:,} against "
            f"{size_before:,} bytes): nothing in this model gains from {mode} mode"
        )
    if target is not None and is_exact(target) and not here.exact:
        out.notes.append(
            f"the int8 formats were made for {target} CPUs (exact sums); this CPU's kernels "
            "saturate, so the deployed error below is not what a target CPU gives"
        )
    broken = invalid(quantized)
    if broken:
        out.failures.append(f"the quantized model is not valid ONNX: {broken}")
        return out
    if not batches:
        return out
    try:
        reference = output_error(
            runner(float_model, optimize="disabled"),
            runner(quantized, optimize="disabled"),
            batches,
        )
        deployed = output_error(runner(float_model), runner(quantized), batches)
    except Exception as exc:  # noqa: BLE001 - e.g. bf16 graphs ONNX Runtime's CPU cannot run
        out.notes.append(
            f"not checked: ONNX Runtime cannot run the result here ({str(exc).splitlines()[0][:120]})"
        )
        return out
    out.reference_error, out.deployed_error = reference, deployed
    if not math.isfinite(deployed):
        out.failures.append(
            "the quantized model's outputs have NaN or infinite values (or shapes) the float model's do not"
        )
    elif deployed > MAX_ERROR:
        out.failures.append(
            f"the outputs are mostly error: relative error {deployed:.3g} against the float model "
            "(an accuracy budget keeps the most sensitive layers in float)"
        )
    elif deployed > SLACK * reference + FLOOR:
        overflowing = saturating_layers(quantized) if not here.exact else []
        if overflowing:
            shown = ", ".join(overflowing[:3]) + (
                f" and {len(overflowing) - 3} more" if len(overflowing) > 3 else ""
            )
            why = (
                "this CPU's int8 kernels add products in saturating int16 pairs, which the weights "
                f"of {shown} overflow (quantize for this CPU: target auto or portable)"
            )
        else:
            why = "ONNX Runtime's fused kernels compute something else than the graph says"
        out.failures.append(
            f"as ONNX Runtime runs it here, the output error is {deployed:.3g}, against "
            f"{reference:.3g} for the arithmetic its scales imply: {why}"
        )
    if latency_feeds is not None and mode == "static":
        out.latency = _latency(float_model, quantized, latency_feeds, out)
    return out


def _latency(float_model, quantized, feeds, out: Check) -> dict | None:
    try:
        before, after = compare_latency([float_model, quantized], feeds)
    except Exception as exc:  # noqa: BLE001 - the timing is an addition to the check
        out.notes.append(f"no latency check ({str(exc).splitlines()[0][:120]})")
        return None
    ratio = after.median_ms / max(before.median_ms, 1e-9)
    result = {"float": before.to_dict(), "quantized": after.to_dict(), "ratio": ratio}
    if ratio > SLOWER and after.p25_ms > before.p75_ms:
        top = top_ops(quantized, feeds)
        result["quantized_top_ops"] = top
        out.failures.append(
            f"static int8 runs slower than float here: {after.median_ms:.3g} ms against "
            f"{before.median_ms:.3g} ms ({ratio:.2f}x; ONNX Runtime, this CPU"
            + (f"; its time goes to {top})" if top else ")")
        )
    return result
