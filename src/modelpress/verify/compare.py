"""Run two models on the same inputs and compare their outputs.

Both run under ONNX Runtime with its graph optimizations disabled, so that ORT's own rewrites cannot
hide (or cause) a difference. The relative error of an output is ``max|a - b| / max|a|``: relative to
the output's scale, so that elements near zero do not blow it up.

Generated inputs are fitted to the original model (``verify.fit``): when it cannot run at the
smallest sizes, larger ones are tried and the result says which were used. An empty list of inputs
is an error, never a pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from modelpress.errors import InputError, VerificationError, renamed
from modelpress.ir.feeds import as_model, check_feeds
from modelpress.runtime.ort import session, session_options
from modelpress.verify.fit import fit_inputs

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
    notes: list[str] = field(default_factory=list)  # e.g. the sizes generated inputs had to take
    shapes: dict[str, list[int]] = field(default_factory=dict)  # input shapes of the first set

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    @property
    def max_rel(self) -> float:
        return max((o.max_rel for o in self.outputs), default=0.0)

    def to_dict(self) -> dict:
        return {
            "passed": self.passed,
            "runs": self.runs,
            "shapes": self.shapes,
            "notes": self.notes,
            "outputs": [o.to_dict() for o in self.outputs],
        }

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
        max_abs = (
            float(np.abs(a.astype(np.int64) - b.astype(np.int64)).max())
            if a.dtype != object
            else float(not np.array_equal(a, b))
        )
        scale = float(np.abs(a.astype(np.float64)).max()) if a.dtype != object else 1.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    passed = max_abs <= atol or max_rel <= rtol
    return OutputDiff(name, dtype, a.shape, max_abs, max_rel, rtol, atol, passed)


def _run(
    sess, feeds: dict[str, np.ndarray], *, what: str = "the model failed to run", error=InputError
) -> dict[str, np.ndarray]:
    names = [o.name for o in sess.get_outputs()]
    try:
        values = sess.run(names, feeds)
    except Exception as exc:  # ORT's own exception types
        msg = (str(exc).strip() or type(exc).__name__).splitlines()[0][:300]
        raise error(f"{what}: {msg}") from None
    return dict(zip(names, values))


def _session(model):
    # lent, whatever the model's size: its bytes and ONNX Runtime's parse of them would cost
    # about 3x the weights, for a session that runs a few times
    return session(model, options=session_options(optimize="disabled"), lend_bytes=0)


def run_model(
    model, feeds: dict[str, np.ndarray], *, optimize: str = "disabled"
) -> dict[str, np.ndarray]:
    """Outputs of ``model`` on ``feeds`` under ONNX Runtime, by output name."""

    return _run(session(model, optimize=optimize), feeds)


def verify(
    reference,
    candidate,
    *,
    data: dict[str, np.ndarray] | list[dict[str, np.ndarray]] | None = None,
    dims: dict[str, int] | None = None,
    shapes: dict[str, tuple[int, ...]] | None = None,
    input_sets: int | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int = 0,
    inputs: dict[str, np.ndarray] | list[dict[str, np.ndarray]] | None = None,
    runs: int | None = None,
) -> VerifyResult:
    """Run ``reference`` and ``candidate`` on the same inputs and compare every output.

    ``candidate``: a model, or a function that returns one, called once the reference has run and
    its session is gone (so that a big candidate is only made when the reference's memory is free).

    ``data``: one feed dict or a non-empty list of them (``inputs``: its old name); otherwise ``input_sets`` (2) random feeds are
    generated, fitted to what the reference can run on (``verify.fit``; dynamic dimensions sized by
    ``dims`` by name, or whole input ``shapes``). Outputs are matched by name, or by position when
    the names differ but the counts agree. Per-output tolerances default to ``TOLERANCES``.
    Raises ``InputError`` when the reference itself cannot run on the inputs, and
    ``VerificationError`` when the candidate cannot run where the reference does.
    """
    ref = as_model(reference)
    ref_names = [v.name for v in ref.graph.outputs]
    sess_a = _session(ref)
    notes: list[str] = []
    inputs = renamed(data, inputs, new="data", old="inputs")
    input_sets = renamed(input_sets, runs, new="input_sets", old="runs") or 2
    if inputs is None:
        fitted = fit_inputs(
            ref,
            lambda feeds: _run(sess_a, feeds),
            dims=dims,
            shapes=shapes,
            input_sets=input_sets,
            seed=seed,
        )
        feeds_list, ref_outputs = fitted.feeds, fitted.outputs
        if fitted.note:
            notes.append(fitted.note)
    else:
        feeds_list = [inputs] if isinstance(inputs, dict) else list(inputs)
        if not feeds_list or not any(feeds_list):
            raise InputError("`data` is empty: there is nothing to compare the models on")
        for feeds in feeds_list:
            check_feeds(ref, feeds)
            _refuse_empty(ref, feeds)
        ref_outputs = [
            _run(sess_a, feeds, what="the original model failed to run on the given inputs")
            for feeds in feeds_list
        ]
    # The reference's session is gone before the candidate is made (a function is called only
    # now): the two models' weights are never in memory together.
    sess_a = None
    cand = as_model(candidate() if callable(candidate) else candidate)
    cand_names = [v.name for v in cand.graph.outputs]
    if len(ref_names) != len(cand_names):
        raise VerificationError(f"the models have different outputs: {ref_names} vs {cand_names}")
    pairs = (
        list(zip(ref_names, ref_names))
        if set(ref_names) == set(cand_names)
        else list(zip(ref_names, cand_names))
    )
    sess_b = _session(cand)
    cand_inputs = {i.name for i in cand.graph.inputs}
    worst: dict[str, OutputDiff] = {}
    for feeds, out_a in zip(feeds_list, ref_outputs):
        out_b = _run(
            sess_b,
            {k: v for k, v in feeds.items() if k in cand_inputs},
            what="the model being checked fails on inputs the original model runs on",
            error=VerificationError,
        )
        for ra, cb in pairs:
            d = compare_arrays(ra, out_a[ra], out_b[cb], rtol=rtol, atol=atol)
            prev = worst.get(ra)
            # A failing comparison always outranks a passing one; then the larger error wins.
            if prev is None or (not d.passed, d.max_rel, d.max_abs) > (
                not prev.passed,
                prev.max_rel,
                prev.max_abs,
            ):
                worst[ra] = d
    shapes_used = {k: list(v.shape) for k, v in feeds_list[0].items()}
    return VerifyResult(
        outputs=[worst[n] for n, _ in pairs], runs=len(feeds_list), notes=notes, shapes=shapes_used
    )


def _refuse_empty(model, feeds: dict[str, np.ndarray]) -> None:
    """``InputError`` for an empty batch (size 0 on axis 0) where the model does not declare a 0:
    outputs of an empty batch are empty too, and comparing nothing would pass whatever the models
    do. (An empty axis elsewhere, as a decoder's past of length 0, is a real input.)"""
    for value in model.graph.inputs:
        arr = feeds.get(value.name)
        if arr is None or arr.ndim == 0 or arr.shape[0] != 0 or not value.shape:
            continue
        dim = value.shape[0]
        if not (isinstance(dim, int) and dim == 0):
            raise InputError(
                f"`inputs`: input {value.name!r} is an empty batch (shape {list(arr.shape)}): "
                "there is nothing to compare the models on"
            )
