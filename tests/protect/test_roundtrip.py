"""Protected models compute what the originals compute: a CNN, a transformer, a model with If and
Loop subgraphs and an LSTM, in every mode, against ONNX Runtime on the original (its
optimizations off) on real inputs, at relative 1e-5. Storage mode gives the original back exactly;
runtime mode runs the obfuscated graph and never holds the original's structure or names."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from protect_models import ZOO, sample_inputs

from modelpress.ir import load
from modelpress.protect import open_package, protect
from modelpress.protect.compress_graph import MAX_CAP
from modelpress.protect.metrics import is_standard
from modelpress.protect.names import all_names
from modelpress.runtime.ort import session
from modelpress.verify import compare_arrays, run_model

RTOL = 1e-5
MODELS = [*ZOO, "lstm"]
MODES = [
    ("encrypted", dict()),
    ("storage", dict(obfuscate=True, mode="storage")),
    ("runtime", dict(obfuscate=True, mode="runtime")),
    ("runtime-0.6", dict(obfuscate=True, mode="runtime", ratio=0.6, rename_io=True)),
]


def _check_outputs(original: ir.Model, opened: ir.Model, feeds: dict[str, np.ndarray]) -> None:
    want = run_model(original, feeds)  # ORT, optimizations disabled: the reference
    sess = session(opened, optimize="all")  # the protected model as it would be deployed
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    assert set(got) == set(want)
    for name, value in want.items():
        diff = compare_arrays(name, value, got[name], rtol=RTOL, atol=0.0)
        assert diff.passed, f"{name}: max rel {diff.max_rel:.3g}"


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(("mode", "options"), MODES, ids=[m for m, _ in MODES])
def test_protected_models_compute_the_originals_outputs(
    zoo_paths, key, tmp_path, name, mode, options
):
    original = load(zoo_paths[name])
    out = tmp_path / "model.mpk"
    result = protect(zoo_paths[name], key=key, output=out, verify=False, seed=5, **options)
    assert result.output == str(out) and out.stat().st_size == result.bytes
    opened = open_package(out, key)
    _check_outputs(original, opened, sample_inputs(name))
    if mode in ("encrypted", "storage"):
        _assert_same_model(original, opened)
    else:
        _assert_obfuscated_at_run_time(original, opened)


def _assert_same_model(a: ir.Model, b: ir.Model) -> None:
    """Same graph, names, metadata and bit-identical weights."""
    assert [(n.op_type, n.name, [v.name for v in n.inputs if v]) for n in a.graph] == [
        (n.op_type, n.name, [v.name for v in n.inputs if v]) for n in b.graph
    ]
    assert dict(a.metadata_props) == dict(b.metadata_props)
    assert list(a.graph.initializers) == list(b.graph.initializers)
    for name, value in a.graph.initializers.items():
        x, y = value.const_value.numpy(), b.graph.initializers[name].const_value.numpy()
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), name


def _assert_obfuscated_at_run_time(original: ir.Model, opened: ir.Model) -> None:
    """The graph that runs is the obfuscated one: anonymous nodes, one function each, none of them
    holding more than a group's worth of the original nodes, no original name anywhere."""
    nodes = list(opened.graph)
    assert nodes and all(not is_standard(n.domain) for n in nodes)
    assert len(opened.functions) == len(nodes)
    original_ops = sum(1 for g in original.graphs() for _ in g)
    for f in opened.functions.values():
        real = [n for n in f if n.op_type not in ("Constant",)]
        assert len(real) < max(MAX_CAP + 40, original_ops // 2), (
            "a function holds too much of the original"
        )
    # the interface (inputs, outputs, the model's metadata) is given back on purpose
    interface = {v.name for v in [*original.graph.inputs, *original.graph.outputs]}
    interface |= set(original.metadata_props) | set(original.metadata_props.values())
    leaked = (all_names(original) - interface) & all_names(opened)
    assert not leaked


def test_an_in_memory_package_and_an_obfuscated_onnx_file(zoo_paths, key, tmp_path):
    original = load(zoo_paths["bert-tiny"])
    feeds = sample_inputs("bert-tiny")
    in_memory = protect(original, key=key, obfuscate=True, verify=False)
    assert in_memory.output is None and in_memory.data[:4] == b"\x89MPK"
    _check_outputs(original, open_package(in_memory.data, key), feeds)
    onnx_path = tmp_path / "obfuscated.onnx"
    written = protect(
        original, key=key, output=onnx_path, obfuscate=True, encrypt=False, verify=False
    )
    assert not written.encrypted
    _check_outputs(original, open_package(onnx_path, key), feeds)


def test_protect_verifies_what_it_wrote(zoo_paths, key, tmp_path):
    result = protect(zoo_paths["resnet-digits"], key=key, output=tmp_path / "m.mpk", obfuscate=True)
    assert result.verification["passed"] and result.verification["max_rel"] <= RTOL
    record = result.to_dict()
    assert record["metrics"]["anonymous_share"] == result.metrics.anonymous_share
    assert record["mode"] == "runtime" and record["key_id"] and "data" not in record


def test_the_seed_repeats_the_structure_but_never_the_secrets(zoo_paths, key):
    model = load(zoo_paths["resnet-digits"])
    a = protect(model, key=key, obfuscate=True, seed=11, verify=False, encrypt=False)
    b = protect(model, key=key, obfuscate=True, seed=11, verify=False, encrypt=False)
    c = protect(model, key=key, obfuscate=True, seed=12, verify=False, encrypt=False)
    va, vb, vc = (
        ir.from_proto(__import__("onnx").ModelProto.FromString(r.data)) for r in (a, b, c)
    )
    assert (
        [n.op_type for n in va.graph]
        == [n.op_type for n in vb.graph]
        != [n.op_type for n in vc.graph]
    )
    big = [v for v in va.graph.initializers.values() if v.const_value.size >= 1024]
    assert big
    for sa in big:  # fresh noise keys and mixing secrets, whatever the seed
        sb = vb.graph.initializers[sa.name]
        assert sa.const_value.numpy().tobytes() != sb.const_value.numpy().tobytes()


def test_a_package_that_fails_its_check_is_never_written(zoo_paths, key, tmp_path, monkeypatch):
    import importlib

    from modelpress.errors import VerificationError
    from modelpress.verify import VerifyResult, compare_arrays

    out = tmp_path / "m.mpk"
    out.write_bytes(b"the user's file")
    wrong = compare_arrays("y", np.ones(3, np.float32), np.zeros(3, np.float32))
    api = importlib.import_module("modelpress.protect.api")
    monkeypatch.setattr(api, "verify", lambda *a, **k: VerifyResult(outputs=[wrong], runs=1))
    with pytest.raises(VerificationError, match="does not compute the original's outputs"):
        protect(zoo_paths["control-flow"], key=key, output=out, obfuscate=True)
    assert out.read_bytes() == b"the user's file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.mpk"]


def test_an_already_protected_model_is_refused(zoo_paths, key, tmp_path):
    from modelpress.errors import OptionError

    onnx_path = tmp_path / "o.onnx"
    protect(
        zoo_paths["control-flow"],
        key=key,
        output=onnx_path,
        obfuscate=True,
        encrypt=False,
        verify=False,
    )
    with pytest.raises(OptionError, match="already protected"):
        protect(onnx_path, key=key, output=tmp_path / "again.mpk")


def test_a_model_with_its_own_local_functions(key):
    """A model-local function (as exporters write them) is renamed into the private domain, its
    call sites inside the anonymous nodes follow, and its name leaves the file."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from modelpress.ir import from_proto

    fn = helper.make_function(
        "custom.layers",
        "ScaledTanhBlock",
        ["a", "w"],
        ["out"],
        [helper.make_node("MatMul", ["a", "w"], ["m"]), helper.make_node("Tanh", ["m"], ["out"])],
        opset_imports=[helper.make_opsetid("", 17)],
    )
    w = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32), "block_weight"
    )
    graph = helper.make_graph(
        [
            helper.make_node(
                "ScaledTanhBlock", ["x", "block_weight"], ["h"], domain="custom.layers"
            ),
            helper.make_node("Relu", ["h"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])],
        [w],
    )
    proto = helper.make_model(
        graph,
        functions=[fn],
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom.layers", 1)],
        ir_version=8,
    )
    model = from_proto(proto)
    feeds = {"x": np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)}
    for options in (dict(obfuscate=True, ratio=1.0), dict(obfuscate=True, mode="storage")):
        result = protect(model, key=key, encrypt=False, verify=False, **options)
        assert b"ScaledTanhBlock" not in result.data and b"custom.layers" not in result.data
        _check_outputs(model, open_package(result.data, key), feeds)
    assert onnx.ModelProto.FromString(result.data).functions == []
