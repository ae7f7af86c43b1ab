"""The ONNX backend node tests, run through the optimizer.

``onnx.backend.test.case.node`` defines about 1,900 single-node (and function-expanded) models with
inputs and expected outputs; the installed wheel ships no data files, but ``collect_testcases()``
builds every case in memory, as ``backend-test-tools generate-data`` does before writing them out.
For every case that ONNX Runtime itself passes (its graph optimizations disabled, the case's own
rtol/atol), ``modelpress.optimize(model, level=2)`` must leave a model that still passes: any
failure is a bug in a pass, not in the test.

Level 3 (ONNX Runtime as the target) is held to the same rule. Run as a script to write the
failing case names of both levels to ``benchmarks/_work/node_failures.txt``:
``.venv/bin/python tests/test_backend_node_tests.py``.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnx_ir as ir
import pytest
from onnx.backend.test.case.test_case import TestCase

import modelpress
from modelpress.ir import from_proto, to_proto
from modelpress.runtime.ort import session, session_options

Transform = Callable[[ir.Model], ir.Model]


def optimizer(level: int) -> Transform:
    def transform(model: ir.Model) -> ir.Model:
        return modelpress.optimize(model, level=level).model

    return transform


optimize_level2 = optimizer(2)


@cache
def node_cases() -> tuple[TestCase, ...]:
    # Import here: collecting runs every case's reference implementation (about 10 s of CPU).
    from onnx.backend.test.case import node

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # the reference code warns about overflow on purpose
        return tuple(node.collect_testcases())


def _to_runtime_value(value):
    """A case's input as ONNX Runtime's Python API takes it (numpy arrays, lists, None)."""
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, np.generic):
        return np.array(value)
    if isinstance(value, list):
        return [_to_runtime_value(v) for v in value]
    return value


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text.splitlines()[0][:500]}"


def _mismatch(expected, got, rtol: float, atol: float) -> str | None:
    """Why ``got`` differs from ``expected`` (the backend runner's rule), or None when it does not."""
    if isinstance(expected, list) or isinstance(got, list):
        if not isinstance(expected, list) or not isinstance(got, list) or len(expected) != len(got):
            return "sequence length or kind differs"
        for e, g in zip(expected, got, strict=True):
            if why := _mismatch(e, g, rtol, atol):
                return why
        return None
    if expected is None or got is None:
        return None if expected is None and got is None else "optional presence differs"
    expected = _to_runtime_value(expected)
    e, g = np.asarray(expected), np.asarray(got)
    if e.shape != g.shape:
        return f"shape {g.shape}, expected {e.shape}"
    if e.dtype == object or g.dtype == object:
        return None if np.array_equal(e, g) else "values differ"
    if e.dtype.kind in "fc":
        try:
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)
        except AssertionError:
            diff = np.abs(g.astype(np.float64) - e.astype(np.float64))
            return f"max abs diff {np.nanmax(diff) if diff.size else 0:.3g} (rtol {rtol:g}, atol {atol:g})"
        return None
    return None if np.array_equal(e, g) else "values differ"


def run_case(case: TestCase, model: onnx.ModelProto) -> str | None:
    """Run ``model`` on the case's inputs under ORT (optimizations disabled); why it fails, or None."""
    options = session_options(optimize="disabled", intra_op_threads=1, inter_op_threads=1)
    options.log_severity_level = 4  # the cases ORT fails on purpose would flood stderr
    try:
        sess = session(model.SerializeToString(), options=options)
    except Exception as exc:  # a ModelpressError, or anything ORT raises
        return f"ORT load: {_first_line(exc)}"
    names = [i.name for i in sess.get_inputs()]
    for inputs, expected in case.data_sets:
        if len(inputs) != len(names):
            return f"inputs: the model takes {names}, the case gives {len(inputs)} values"
        feeds = {n: _to_runtime_value(v) for n, v in zip(names, inputs, strict=True)}
        try:
            outputs = sess.run(None, feeds)
        except Exception as exc:
            return f"ORT run: {_first_line(exc)}"
        if len(outputs) != len(expected):
            return f"{len(outputs)} outputs, expected {len(expected)}"
        for i, (e, g) in enumerate(zip(expected, outputs, strict=True)):
            if why := _mismatch(e, g, case.rtol, case.atol):
                return f"output {i}: {why}"
    return None


@dataclass
class SweepReport:
    cases: int = 0
    eligible: int = 0  # cases ONNX Runtime itself passes
    failures: dict[str, str] = field(default_factory=dict)  # case name -> why
    seconds: float = 0.0

    def message(self) -> str:
        lines = [f"{len(self.failures)} of {self.eligible} node tests fail after optimization:"]
        lines += [f"  {name}: {why}" for name, why in sorted(self.failures.items())]
        return "\n".join(lines)


def check_transform(case: TestCase, transform: Transform) -> str | None:
    """None when ``transform`` keeps ``case`` passing, else why not (the case must pass as given)."""
    try:
        transformed = to_proto(transform(from_proto(case.model)))
    except Exception as exc:  # a pass that crashes is a bug like any other
        return f"optimize raised {_first_line(exc)}"
    return run_case(case, transformed)


@contextlib.contextmanager
def _quiet_onnx_ir():
    # onnx-ir warns about subgraph outputs taken straight from the outer scope, which some
    # cases (AffineGrid's expansion) have on purpose.
    logger = logging.getLogger("onnx_ir")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@cache
def ort_passing_cases() -> tuple[TestCase, ...]:
    """The node tests ONNX Runtime itself passes: the ones an optimized model can be held to."""
    with _quiet_onnx_ir():
        return tuple(c for c in node_cases() if run_case(c, c.model) is None)


def sweep(transform: Transform = optimize_level2, cases=None) -> SweepReport:
    """Check ``transform`` on ``cases`` (default: every node test) that ORT passes as given."""
    start = time.perf_counter()
    report = SweepReport()
    with _quiet_onnx_ir():
        if cases is None:
            report.cases = len(node_cases())
            eligible = ort_passing_cases()
        else:
            report.cases = len(cases)
            eligible = [c for c in cases if run_case(c, c.model) is None]
        report.eligible = len(eligible)
        for case in eligible:
            if why := check_transform(case, transform):
                report.failures[case.name] = why
    report.seconds = time.perf_counter() - start
    return report


def _add_case(op: str = "Add") -> TestCase:
    """A small hand-made case, so the harness's own behaviour can be tested in milliseconds."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    y = rng.standard_normal((3, 4)).astype(np.float32)
    model = onnx.parser.parse_model(
        f"""<ir_version: 8, opset_import: ["" : 17]>
        g (float[3, 4] x, float[3, 4] y) => (float[3, 4] z) {{
            i = Identity(x)
            z = {op}(i, y)
        }}"""
    )
    return TestCase(
        name=f"hand_made_{op.lower()}",
        model_name=f"hand_made_{op.lower()}",
        url=None,
        model_dir=None,
        model=model,
        data_sets=[([x, y], [x + y])],
        kind="node",
        rtol=1e-3,
        atol=1e-7,
    )


def _add_becomes_sub(model: ir.Model) -> ir.Model:
    for node in model.graph:
        if node.op_type == "Add":
            node.op_type = "Sub"
    return model


def test_sweep_passes_a_correct_rewrite_and_catches_a_wrong_one():
    cases = [_add_case("Add"), _add_case("Sub")]  # the second does not match its expected output
    good = sweep(optimize_level2, cases)
    assert (good.cases, good.eligible, good.failures) == (2, 1, {})
    bad = sweep(_add_becomes_sub, cases)
    assert list(bad.failures) == ["hand_made_add"]
    assert bad.failures["hand_made_add"].startswith("output 0: max abs diff")

    def crash(model: ir.Model) -> ir.Model:
        raise ValueError("boom")

    assert sweep(crash, cases).failures == {"hand_made_add": "optimize raised ValueError: boom"}


@pytest.mark.slow
@pytest.mark.parametrize("level", [2, 3])
def test_optimizer_keeps_every_node_test_that_onnxruntime_passes(level):
    report = sweep(optimizer(level))
    # The harness itself must work: ORT passes most of the ~1,900 cases.
    assert report.cases > 1500 and report.eligible > 1000, (report.cases, report.eligible)
    assert not report.failures, f"level {level}: {report.message()}"


if __name__ == "__main__":
    out = Path(__file__).resolve().parents[1] / "benchmarks" / "_work" / "node_failures.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for level in (2, 3):
        result = sweep(optimizer(level))
        lines += [f"level {level}\t{n}\t{why}\n" for n, why in sorted(result.failures.items())]
        print(
            f"level {level}: {result.cases} cases, {result.eligible} pass under ONNX Runtime, "
            f"{len(result.failures)} fail after optimization [{result.seconds:.0f} s]"
        )
        for name, why in sorted(result.failures.items()):
            print(f"  {name}: {why}")
    out.write_text("".join(lines))
    print(f"failing case names in {out}")
