"""Run two models on the same inputs and compare their outputs.

Both run under ONNX Runtime with its graph optimizations disabled, so that ORT's own rewrites cannot
hide (or cause) a difference. The relative error of an output is ``max|a - b| / max|a|``: relative to
the output's scale, so that elements near zero do not blow it up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from modelpress.errors import InputError, VerificationError
from modelpress.ir.feeds import as_model, check_feeds
from modelpress.verify.inputs import generate_inputs

# (relative, absolute) tolerance per output dtype; integers and booleans must match exactly.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-9),
    "float32": (1e-4, 1e-5),
    "float16": (1e-2, 1e-3),
    "bfloat16": (2e-2, 1e-2),
}


@dataclass(frozen=True)
class OutputDiff:
    name: str
    dtype: str
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float
    rtol: float
    atol: float
    passed: bool

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class VerifyResult:
    outputs: list[OutputDiff]
    runs: int

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    @property
    def max_rel(self) -> float:
        return max((o.max_rel for o in self.outputs), default=0.0)

    def to_dict(self) -> dict:
        return {"passed": self.passed, "runs": self.runs, "outputs": [o.to_dict() for o in self.outputs]}

    def raise_if_failed(self, what: str = "the models") -> None:
        if not self.passed:
            worst = max(self.outputs, key=lambda o: o.max_rel / max(o.rtol, 1e-30))
            raise VerificationError(
                f"{what} differ: output {worst.name!r} max abs {worst.max_abs:.3g}, "
                f"max rel {worst.max_rel:.3g} (tolerance rel {worst.rtol:g})"
            )


def compare_arrays(name: str, a: np.ndarray, b: np.ndarray, *, rtol=None, atol=None) -> OutputDiff:
    a = np.asarray(a)
    b = np.asarray(b)
    dtype = str(a.dtype)
    default_rtol, default_atol = TOLERANCES.get(dtype, (0.0, 0.0))
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    if a.shape != b.shape:
        return OutputDiff(name, dtype, a.shape, float("inf"), float("inf"), rtol, atol, False)
    if a.size == 0:
        return OutputDiff(name, dtype, a.shape, 0.0, 0.0, rtol, atol, True)
    if a.dtype.kind in "fc" or b.dtype.kind in "fc":
        af = a.astype(np.float64)
        bf = b.astype(np.float64)
        same_nan = np.isnan(af) == np.isnan(bf)
        finite = np.isfinite(af) & np.isfinite(bf)
        same_inf = np.where(np.isinf(af) | np.isinf(bf), af == bf, True)
        if not (same_nan.all() and same_inf.all()):
            return OutputDiff(name, dtype, a.shape, float("inf"), float("inf"), rtol, atol, False)
        diff = np.abs(af - bf)[finite]
        max_abs = float(diff.max()) if diff.size else 0.0
        scale = float(np.abs(af[finite]).max()) if diff.size else 0.0
    else:
        max_abs = float(np.abs(a.astype(np.int64) - b.astype(np.int64)).max()) if a.dtype != object else float(not np.array_equal(a, b))
        scale = float(np.abs(a.astype(np.float64)).max()) if a.dtype != object else 1.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    passed = max_abs <= atol or max_rel <= rtol
    return OutputDiff(name, dtype, a.shape, max_abs, max_rel, rtol, atol, passed)


def _run(sess, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in sess.get_outputs()]
    try:
        values = sess.run(names, feeds)
    except Exception as exc:  # ORT's own exception types
        raise InputError(f"the model failed to run: {str(exc).strip().splitlines()[0][:300]}") from None
    return dict(zip(names, values))


def run_model(model, feeds: dict[str, np.ndarray], *, optimize: str = "disabled") -> dict[str, np.ndarray]:
    """Outputs of ``model`` on ``feeds`` under ONNX Runtime, by output name."""
    from modelpress.runtime.ort import session

    return _run(session(model, optimize=optimize), feeds)


def verify(
    reference,
    candidate,
    *,
    inputs: dict[str, np.ndarray] | list[dict[str, np.ndarray]] | None = None,
    dims: dict[str, int] | None = None,
    runs: int = 2,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int = 0,
) -> VerifyResult:
    """Run ``reference`` and ``candidate`` on the same inputs and compare every output.

    ``inputs``: one feed dict or a list of them; otherwise ``runs`` random feeds are generated
    (dynamic dimensions sized by ``dims``). Outputs are matched by name, or by position when the
    names differ but the counts agree. Per-output tolerances default to ``TOLERANCES``.
    """
    ref = as_model(reference)
    cand = as_model(candidate)
    if inputs is None:
        feeds_list = [generate_inputs(ref, dims=dims, seed=seed + i) for i in range(runs)]
    else:
        feeds_list = [inputs] if isinstance(inputs, dict) else list(inputs)
        for feeds in feeds_list:
            check_feeds(ref, feeds)
    ref_names = [v.name for v in ref.graph.outputs]
    cand_names = [v.name for v in cand.graph.outputs]
    if len(ref_names) != len(cand_names):
        raise VerificationError(
            f"the models have different outputs: {ref_names} vs {cand_names}"
        )
    pairs = list(zip(ref_names, ref_names)) if set(ref_names) == set(cand_names) else list(zip(ref_names, cand_names))
    from modelpress.runtime.ort import session

    sess_a = session(ref, optimize="disabled")
    sess_b = session(cand, optimize="disabled")
    cand_inputs = {i.name for i in cand.graph.inputs}
    worst: dict[str, OutputDiff] = {}
    for feeds in feeds_list:
        out_a = _run(sess_a, feeds)
        out_b = _run(sess_b, {k: v for k, v in feeds.items() if k in cand_inputs})
        for ra, cb in pairs:
            d = compare_arrays(ra, out_a[ra], out_b[cb], rtol=rtol, atol=atol)
            prev = worst.get(ra)
            # A failing comparison always outranks a passing one; then the larger error wins.
            if prev is None or (not d.passed, d.max_rel, d.max_abs) > (not prev.passed, prev.max_rel, prev.max_abs):
                worst[ra] = d
    return VerifyResult(outputs=[worst[n] for n, _ in pairs], runs=len(feeds_list))
