"""The ONNX backend node tests, run through the PyTorch backend.

``onnx.backend.test.case.node.collect_testcases()`` builds every node test (model, inputs, expected
outputs, rtol/atol) in memory; nothing is written to disk. A case counts when every op in its graph
(subgraphs included) is one the backend claims (``supported_ops()``). Cases whose tensors have an
element type torch has no dtype for (int4/uint4/int2/uint2, float4e2m1, float8e8m0, strings) are
counted apart: the backend rejects them with a clear error, and the pass rate is given both with and
without them. The target is >= 95% of the claimed, representable cases.

Run as a script for the summary and the failing cases:
``.venv/bin/python tests/runtime/test_torch_node_tests.py [DEVICE]`` (``cuda:0`` on a GPU).
"""

from __future__ import annotations

import collections
import warnings
from dataclasses import dataclass, field
from functools import cache

import numpy as np
import onnx
import onnx.numpy_helper
import pytest

torch = pytest.importorskip("torch")

from modelpress.ir import from_proto  # noqa: E402
from modelpress.runtime.torch_backend import supported_ops, to_torch  # noqa: E402
from modelpress.runtime.torch_backend.backend import ieee_fp32  # noqa: E402
from modelpress.runtime.torch_backend.registry import TORCH_DTYPES, from_numpy, to_numpy  # noqa: E402

TARGET = 0.95
_REPRESENTABLE = {int(t) for t in TORCH_DTYPES}


@dataclass
class NodeTestSummary:
    passed: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (case, first line of the error)
    unrepresentable: list[str] = field(default_factory=list)  # dtypes torch lacks, also failing
    per_op: dict[str, list[int]] = field(
        default_factory=lambda: collections.defaultdict(lambda: [0, 0])
    )

    @property
    def rate(self) -> float:
        return len(self.passed) / max(1, len(self.passed) + len(self.failed))

    @property
    def rate_all(self) -> float:
        total = len(self.passed) + len(self.failed) + len(self.unrepresentable)
        return len(self.passed) / max(1, total)


def _graph_ops(graph: onnx.GraphProto):
    for node in graph.node:
        yield node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}:{node.op_type}"
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graph_ops(attr.g)


def _elem_types(model: onnx.ModelProto):
    for v in list(model.graph.input) + list(model.graph.output):
        if v.type.HasField("tensor_type"):
            yield v.type.tensor_type.elem_type
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.name in ("to", "output_dtype") and attr.i:
                yield attr.i


def _array(a):
    return onnx.numpy_helper.to_array(a) if isinstance(a, onnx.TensorProto) else np.asarray(a)


def _check_case(case, device: str = "cpu") -> None:
    module = to_torch(from_proto(case.model), device=device)
    names = [i.name for i in case.model.graph.input]
    for inputs, outputs in case.data_sets:
        feeds = {n: from_numpy(_array(a)).to(device) for n, a in zip(names, inputs, strict=False)}
        with torch.no_grad(), ieee_fp32():  # as TorchPrepared.run
            got = module.program.run(module, feeds)
        for g, expected in zip(got, outputs, strict=False):
            g, expected = to_numpy(g), _array(expected)
            assert g.shape == expected.shape, f"shape {g.shape}, expected {expected.shape}"
            assert g.dtype == expected.dtype, f"dtype {g.dtype}, expected {expected.dtype}"
            if g.dtype.kind in "fcV":
                with np.errstate(invalid="ignore"):  # float8 NaN patterns
                    g, expected = g.astype(np.float64), expected.astype(np.float64)
            np.testing.assert_allclose(g, expected, rtol=case.rtol, atol=case.atol)


@cache
def run_node_tests(device: str = "cpu") -> NodeTestSummary:
    """Every node test whose ops the backend claims, run on ``device`` (``cuda:0`` on a GPU)."""
    import onnx.backend.test.case.node as node_cases

    claimed = set(supported_ops())
    summary = NodeTestSummary()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case generators divide by zero on purpose
        cases = node_cases.collect_testcases(None)
    for case in cases:
        ops = set(_graph_ops(case.model.graph))
        if not ops <= claimed:
            continue
        op_name = (
            case.model.graph.node[0].op_type if len(case.model.graph.node) == 1 else "(expanded)"
        )
        if not set(_elem_types(case.model)) <= _REPRESENTABLE:
            summary.unrepresentable.append(case.name)
            continue
        try:
            _check_case(case, device)
        except Exception as exc:  # any failure is a failed case; the message says which
            text = str(exc).strip().splitlines()
            summary.failed.append(
                (case.name, f"{type(exc).__name__}: {text[0][:160] if text else ''}")
            )
            summary.per_op[op_name][1] += 1
        else:
            summary.passed.append(case.name)
            summary.per_op[op_name][0] += 1
    return summary


@pytest.mark.slow
def test_node_tests_pass_rate_over_claimed_ops():
    s = run_node_tests()
    assert len(s.passed) > 1000  # the sweep really ran
    failures = "\n".join(f"  {name}: {why}" for name, why in s.failed)
    assert s.rate >= TARGET, f"pass rate {s.rate:.1%} < {TARGET:.0%}; failures:\n{failures}"


@pytest.mark.slow
def test_core_ops_pass_every_node_test():
    # the ops of common CNN, transformer and recurrent models have no failing case at all
    s = run_node_tests()
    core = {
        "Conv",
        "ConvTranspose",
        "MaxPool",
        "AveragePool",
        "BatchNormalization",
        "Gemm",
        "MatMul",
        "Softmax",
        "LayerNormalization",
        "Gather",
        "Reshape",
        "Transpose",
        "Slice",
        "Concat",
        "LSTM",
        "GRU",
        "RNN",
        "If",
        "Loop",
        "Where",
        "Expand",
        "Pad",
    }
    bad = {op: counts for op, counts in s.per_op.items() if op in core and counts[1]}
    assert bad == {}


if __name__ == "__main__":
    import sys

    s = run_node_tests(sys.argv[1] if len(sys.argv) > 1 else "cpu")
    total = len(s.passed) + len(s.failed)
    print(f"claimed ops: {len(supported_ops())}")
    print(f"representable cases: {len(s.passed)}/{total} passed ({s.rate:.1%})")
    print(
        f"all claimed cases:   {len(s.passed)}/{total + len(s.unrepresentable)} passed ({s.rate_all:.1%}); "
        f"{len(s.unrepresentable)} use element types torch lacks"
    )
    for name, why in s.failed:
        print(f"FAIL {name}: {why}")
