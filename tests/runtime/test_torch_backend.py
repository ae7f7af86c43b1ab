"""The PyTorch backend against ONNX Runtime on generated models, and training through it.

Every model here is built in code (ONNX helper or text), run by ONNX Runtime with its optimizations
disabled (``verify.run_model``) and by the ``OnnxModule``; float outputs must agree within 1e-5
relative, integer outputs exactly. Training tests check that gradients reach every weight, that a
step of SGD lowers the loss, and that the exported model computes what the trained module does.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest

torch = pytest.importorskip("torch")

from modelpress.errors import InputError, MissingExtraError, OptionError  # noqa: E402
from modelpress.ir import from_proto  # noqa: E402
from modelpress.runtime.backend import get_backend  # noqa: E402
from modelpress.runtime.torch_backend import (  # noqa: E402
    UnsupportedOpError,
    supported_ops,
    to_onnx,
    to_torch,
)
from modelpress.verify import run_model  # noqa: E402

pytestmark = pytest.mark.torch
F32 = onnx.TensorProto.FLOAT
I64 = onnx.TensorProto.INT64


def _model(nodes, inputs, outputs, inits, opset=17):
    graph = oh.make_graph(
        nodes, "g", inputs, outputs, [onh.from_array(v, k) for k, v in inits.items()]
    )
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    proto.ir_version = 8
    onnx.checker.check_model(proto, full_check=True)
    return from_proto(proto)


def _vi(name, elem, shape):
    return oh.make_tensor_value_info(name, elem, shape)


def _run_torch(model, feeds):
    module = to_torch(model)
    with torch.no_grad():
        out = module(**{k: torch.from_numpy(v) for k, v in feeds.items()})
    out = out if isinstance(out, tuple) else (out,)
    return dict(zip(module.output_names, (o.numpy() for o in out), strict=False))


def _assert_matches_ort(model, feeds, rtol=1e-5):
    ref = run_model(model, feeds)
    got = _run_torch(model, feeds)
    assert list(got) == list(ref)
    for name, expected in ref.items():
        assert got[name].shape == expected.shape, name
        assert got[name].dtype == expected.dtype, name
        if expected.dtype.kind in "fc":
            scale = max(float(np.abs(expected).max()), 1e-30)
            rel = float(np.abs(got[name] - expected).max()) / scale
            assert rel <= rtol, f"{name}: relative error {rel:.3g}"
        else:
            np.testing.assert_array_equal(got[name], expected, err_msg=name)


def cnn_model(rng):
    w = lambda *s: (rng.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    inits = {
        "c1.w": w(8, 3, 3, 3),
        "c1.b": w(8),
        "bn.scale": (1 + w(8)),
        "bn.bias": w(8),
        "bn.mean": w(8),
        "bn.var": np.abs(w(8)) + 0.5,
        "dw.w": w(8, 1, 3, 3),
        "c2.w": w(16, 8, 1, 1),
        "fc.w": w(10, 16),
        "fc.b": w(10),
    }
    nodes = [
        oh.make_node(
            "Conv", ["x", "c1.w", "c1.b"], ["c1"], pads=[1, 1, 1, 1], strides=[1, 1], name="conv1"
        ),
        oh.make_node(
            "BatchNormalization",
            ["c1", "bn.scale", "bn.bias", "bn.mean", "bn.var"],
            ["bn"],
            epsilon=1e-3,
        ),
        oh.make_node("Relu", ["bn"], ["r1"]),
        oh.make_node(
            "MaxPool",
            ["r1"],
            ["p1"],
            kernel_shape=[3, 3],
            strides=[2, 2],
            pads=[0, 0, 1, 1],
            ceil_mode=1,
        ),
        oh.make_node(
            "Conv",
            ["p1", "dw.w"],
            ["dw"],
            group=8,
            auto_pad="SAME_UPPER",
            strides=[2, 2],
            dilations=[1, 1],
        ),
        oh.make_node("Clip", ["dw", "", "six"], ["relu6"]),
        oh.make_node("Conv", ["relu6", "c2.w"], ["c2"]),
        oh.make_node(
            "AveragePool",
            ["c2"],
            ["ap"],
            kernel_shape=[2, 2],
            strides=[1, 1],
            pads=[1, 0, 0, 1],
            count_include_pad=0,
        ),
        oh.make_node("GlobalAveragePool", ["ap"], ["gap"]),
        oh.make_node("Flatten", ["gap"], ["flat"]),
        oh.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], transB=1),
    ]
    inits["six"] = np.array(6.0, dtype=np.float32)
    return _model(nodes, [_vi("x", F32, ["N", 3, 15, 15])], [_vi("logits", F32, ["N", 10])], inits)


def transformer_model(rng, vocab=50, seq=7, dim=16, heads=2):
    w = lambda *s: (rng.standard_normal(s) * 0.2).astype(np.float32)  # noqa: E731
    hd = dim // heads
    inits = {
        "tok": w(vocab, dim),
        "pos": w(seq, dim),
        "ln1.g": 1 + w(dim),
        "ln1.b": w(dim),
        "ln2.g": 1 + w(dim),
        "ln2.b": w(dim),
        "q.w": w(dim, dim),
        "q.b": w(dim),
        "k.w": w(dim, dim),
        "k.b": w(dim),
        "v.w": w(dim, dim),
        "v.b": w(dim),
        "o.w": w(dim, dim),
        "o.b": w(dim),
        "f1.w": w(dim, 4 * dim),
        "f1.b": w(4 * dim),
        "f2.w": w(4 * dim, dim),
        "f2.b": w(dim),
        "heads_shape": np.array([0, 0, heads, hd], np.int64),
        "merge_shape": np.array([0, 0, dim], np.int64),
        "axes12": np.array([1, 2], np.int64),
        "sqrt_hd": np.array(np.sqrt(hd), np.float32),
        "one": np.array(1.0, np.float32),
        "neg": np.array(-1e4, np.float32),
        "half": np.array(0.5, np.float32),
        "sqrt2": np.array(np.sqrt(2.0), np.float32),
    }
    n = oh.make_node
    nodes = [
        n("Gather", ["tok", "ids"], ["emb"], name="embed"),
        n("Add", ["emb", "pos"], ["h0"]),
        n("LayerNormalization", ["h0", "ln1.g", "ln1.b"], ["h1"], axis=-1, epsilon=1e-5),
    ]
    for p in "qkv":
        nodes += [
            n("MatMul", ["h1", f"{p}.w"], [f"{p}m"]),
            n("Add", [f"{p}m", f"{p}.b"], [f"{p}a"]),
            n("Reshape", [f"{p}a", "heads_shape"], [f"{p}r"]),
            n("Transpose", [f"{p}r"], [f"{p}t"], perm=[0, 2, 3, 1] if p == "k" else [0, 2, 1, 3]),
        ]
    nodes += [
        n("MatMul", ["qt", "kt"], ["scores"]),
        n("Div", ["scores", "sqrt_hd"], ["scaled"]),
        # the padding mask: (1 - mask) * -1e4 added to the scores of padded keys
        n("Cast", ["mask"], ["maskf"], to=F32),
        n("Sub", ["one", "maskf"], ["inv"]),
        n("Mul", ["inv", "neg"], ["bias"]),
        n("Unsqueeze", ["bias", "axes12"], ["bias4"]),
        n("Add", ["scaled", "bias4"], ["masked"]),
        n("Softmax", ["masked"], ["probs"], axis=-1),
        n("MatMul", ["probs", "vt"], ["ctx"]),
        n("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        n("Reshape", ["ctx_t", "merge_shape"], ["merged"]),
        n("MatMul", ["merged", "o.w"], ["om"]),
        n("Add", ["om", "o.b"], ["oa"]),
        n("Add", ["oa", "h0"], ["res1"]),
        n("LayerNormalization", ["res1", "ln2.g", "ln2.b"], ["h2"], axis=-1),
        n("MatMul", ["h2", "f1.w"], ["f1m"]),
        n("Add", ["f1m", "f1.b"], ["f1a"]),
        # GELU written out: 0.5 * x * (1 + erf(x / sqrt 2)), as exporters emit it
        n("Div", ["f1a", "sqrt2"], ["gd"]),
        n("Erf", ["gd"], ["ge"]),
        n("Add", ["ge", "one"], ["g1"]),
        n("Mul", ["f1a", "g1"], ["gm"]),
        n("Mul", ["gm", "half"], ["gelu"]),
        n("MatMul", ["gelu", "f2.w"], ["f2m"]),
        n("Add", ["f2m", "f2.b"], ["f2a"]),
        n("Add", ["f2a", "res1"], ["out"]),
    ]
    return _model(
        nodes,
        [_vi("ids", I64, ["B", seq]), _vi("mask", I64, ["B", seq])],
        [_vi("out", F32, ["B", seq, dim])],
        inits,
    )


def transformer_feeds(rng, batch=3, seq=7, vocab=50):
    ids = rng.integers(0, vocab, size=(batch, seq)).astype(np.int64)
    mask = np.ones((batch, seq), np.int64)
    mask[1, 5:] = 0
    mask[2, 3:] = 0
    return {"ids": ids, "mask": mask}


def rnn_model(rng, seq=6, batch=4, inp=5, hidden=7):
    w = lambda *s: (rng.standard_normal(s) * 0.4).astype(np.float32)  # noqa: E731
    inits = {
        "lstm.W": w(2, 4 * hidden, inp),
        "lstm.R": w(2, 4 * hidden, hidden),
        "lstm.B": w(2, 8 * hidden),
        "gru.W": w(1, 3 * hidden, 2 * hidden),
        "gru.R": w(1, 3 * hidden, hidden),
        "gru.B": w(1, 6 * hidden),
        "rnn.W": w(1, hidden, hidden),
        "rnn.R": w(1, hidden, hidden),
        "merge": np.array([0, 0, -1], np.int64),
        "perm_shape": np.array([seq, batch, 2 * hidden], np.int64),
    }
    n = oh.make_node
    nodes = [
        n(
            "LSTM",
            ["x", "lstm.W", "lstm.R", "lstm.B", "lens", "h0", ""],
            ["ly", "lh", "lc"],
            hidden_size=hidden,
            direction="bidirectional",
            name="lstm",
        ),
        n("Transpose", ["ly"], ["lyt"], perm=[0, 2, 1, 3]),
        n("Reshape", ["lyt", "perm_shape"], ["lyr"]),
        n(
            "GRU",
            ["lyr", "gru.W", "gru.R", "gru.B"],
            ["gy", "gh"],
            hidden_size=hidden,
            linear_before_reset=1,
            direction="reverse",
            name="gru",
        ),
        n("Squeeze", ["gy", "one_axis"], ["gys"]),
        n("RNN", ["gys", "rnn.W", "rnn.R"], ["", "rh"], hidden_size=hidden, name="rnn"),
    ]
    inits["one_axis"] = np.array([1], np.int64)
    inits["h0"] = w(2, batch, hidden)
    return _model(
        nodes,
        [_vi("x", F32, [seq, batch, inp]), _vi("lens", onnx.TensorProto.INT32, [batch])],
        [
            _vi("lh", F32, [2, batch, hidden]),
            _vi("lc", F32, [2, batch, hidden]),
            _vi("rh", F32, [1, batch, hidden]),
        ],
        inits,
    )


def test_cnn_matches_ort(rng):
    model = cnn_model(rng)
    _assert_matches_ort(model, {"x": rng.standard_normal((2, 3, 15, 15)).astype(np.float32)})


def test_transformer_block_matches_ort(rng):
    _assert_matches_ort(transformer_model(rng), transformer_feeds(rng))


def test_recurrent_layers_match_ort(rng):
    feeds = {
        "x": rng.standard_normal((6, 4, 5)).astype(np.float32),
        "lens": np.array([6, 3, 1, 5], np.int32),  # ragged: outputs and states stop per sequence
    }
    _assert_matches_ort(rnn_model(rng), feeds)


def test_if_and_loop_match_ort(rng):
    from modelpress.zoo.control_flow import build_proto

    model = from_proto(build_proto())
    for sign in (1.0, -1.0):  # both branches of the If
        x = (sign * np.abs(rng.standard_normal((3, 16)))).astype(np.float32)
        _assert_matches_ort(model, {"x": x})


def test_scan_matches_ort():
    from mp_testing import model_from_text

    model = model_from_text("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2] init, float[5, 2] xs) => (float[2] last, float[5, 2] partial) {
        last, partial = Scan (init, xs) <num_scan_inputs = 1, scan_input_directions = [1], body = b (float[2] s, float[2] x) => (float[2] s2, float[2] out) {
            s2 = Add(s, x)
            out = Mul(s2, x)
        }>
    }
    """)
    _assert_matches_ort(
        model,
        {
            "init": np.array([1, -1], np.float32),
            "xs": np.arange(10, dtype=np.float32).reshape(5, 2),
        },
    )


def test_integer_ops_match_ort_exactly():
    from mp_testing import model_from_text

    model = model_from_text("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (int64[N, 6] a, int64[N, 6] b) => (int64[N, 6] q, int64[N, 6] r, int64[N, 6] fr, int64[N] am, int64[N, 2] tv, int64[N, 2] ti,
                                         int64[N, 6] cs, int32[N, 6] c32, int64[3] rg, int64[M] flat, bool[N, 6] eq)
      <int64[1] k = {2}, int64 one = {1}, int64 zero = {0}, int64 start = {10}, int64 limit = {2}, int64 delta = {-3}> {
        q = Div(a, b)
        r = Mod(a, b)
        fr = Mod <fmod = 1> (a, b)
        am = ArgMax <axis = 1, keepdims = 0, select_last_index = 1> (a)
        tv, ti = TopK <axis = 1> (a, k)
        cs = CumSum <reverse = 1, exclusive = 1> (a, one)
        c32 = Cast <to = 6> (q)
        rg = Range(start, limit, delta)
        shp = Shape(a)
        n = Gather <axis = 0> (shp, zero)
        six = Gather <axis = 0> (shp, one)
        total = Mul(n, six)
        newshape = Unsqueeze(total, zero)
        flat = Reshape(cs, newshape)
        eq = Equal(r, fr)
    }
    """)
    rng = np.random.default_rng(1)
    a = rng.integers(-20, 20, size=(4, 6)).astype(np.int64)
    a[0, :2] = 7  # ties for ArgMax (select_last_index) and TopK (lower index first)
    b = rng.choice([-7, -3, -2, 2, 3, 5], size=(4, 6)).astype(np.int64)
    _assert_matches_ort(model, {"a": a, "b": b})


def test_initializers_become_parameters_and_buffers(rng):
    module = to_torch(cnn_model(rng))
    params = {
        module.onnx_names[k]
        for k in ("c1.w", "c1.b", "bn.scale", "bn.bias", "dw.w", "c2.w", "fc.w", "fc.b")
    }
    assert {n for n, _ in module.named_parameters()} == params
    buffers = {n for n, _ in module.named_buffers()}
    assert {
        module.onnx_names["bn.mean"],
        module.onnx_names["bn.var"],
        module.onnx_names["six"],
    } <= buffers
    # moving the module moves every tensor the graph reads
    assert all(t.dtype == torch.float64 for t in module.to(torch.float64).parameters())


@pytest.mark.parametrize("which", ["cnn", "transformer", "rnn"])
def test_gradients_reach_every_weight(rng, which):
    if which == "cnn":
        model, feeds = cnn_model(rng), {"x": torch.randn(2, 3, 15, 15)}
    elif which == "transformer":
        model, feeds = (
            transformer_model(rng),
            {k: torch.from_numpy(v) for k, v in transformer_feeds(rng).items()},
        )
    else:
        model = rnn_model(rng)
        feeds = {"x": torch.randn(6, 4, 5), "lens": torch.tensor([6, 3, 1, 5], dtype=torch.int32)}
    module = to_torch(model).train()
    out = module(**feeds)
    outs = out if isinstance(out, tuple) else (out,)
    sum((o.float() ** 2).sum() for o in outs).backward()
    params = dict(module.named_parameters())
    assert params
    no_grad = [n for n, p in params.items() if p.grad is None or not torch.any(p.grad != 0)]
    assert no_grad == []


def test_training_step_lowers_loss_and_export_matches(rng):
    model = cnn_model(rng)
    module = to_torch(model).train()
    x = torch.randn(8, 3, 15, 15, generator=torch.Generator().manual_seed(0))
    target = torch.randint(0, 10, (8,), generator=torch.Generator().manual_seed(1))
    opt = torch.optim.SGD(module.parameters(), lr=0.05)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(module(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        final = float(torch.nn.functional.cross_entropy(module(x), target))
    assert final < losses[0]

    exported = to_onnx(module)
    w_before = model.graph.initializers["fc.w"].const_value.numpy()
    w_after = exported.graph.initializers["fc.w"].const_value.numpy()
    assert not np.allclose(w_before, w_after)  # the original model is untouched, the export changed
    assert (
        exported.graph.initializers["fc.w"].const_value.dtype
        == model.graph.initializers["fc.w"].const_value.dtype
    )
    with torch.no_grad():
        expected = module(x).numpy()
    got = run_model(exported, {"x": x.numpy()})["logits"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_unsupported_op_names_op_and_node():
    from mp_testing import model_from_text

    model = model_from_text("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[4] x) => (float[M] y) {
        a = Relu(x)
        y = Unique <sorted = 1> (a)
    }
    """)
    model.graph.node(1).name = "dedupe"
    with pytest.raises(UnsupportedOpError, match=r"'dedupe'.*Unique"):
        to_torch(model)


def test_custom_domain_op_is_unsupported():
    from mp_testing import model_from_text

    model = model_from_text("""
    <ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
    g (float[4] x) => (float[4] y) {
        y = com.microsoft.FastGelu(x)
    }
    """)
    with pytest.raises(UnsupportedOpError, match=r"FastGelu in domain 'com.microsoft'"):
        to_torch(model)


def test_backend_contract(rng):
    backend = get_backend("torch")
    assert backend.devices()[-1] == "cpu"
    model = transformer_model(rng)
    prepared = backend.prepare(model, device="cpu")
    assert prepared.input_names == ["ids", "mask"] and prepared.output_names == ["out"]
    feeds = transformer_feeds(rng)
    np.testing.assert_allclose(
        prepared.run(feeds)["out"], run_model(model, feeds)["out"], rtol=1e-5, atol=1e-6
    )
    with pytest.raises(InputError, match="'mask'"):
        prepared.run({"ids": feeds["ids"]})
    with pytest.raises(OptionError, match="'cuda:7'"):
        backend.prepare(model, device="cuda:7")


def test_bad_shape_names_the_node(rng):
    prepared = get_backend("torch").prepare(cnn_model(rng))
    with pytest.raises(InputError, match="conv1"):
        prepared.run({"x": np.zeros((1, 4, 15, 15), np.float32)})  # 4 channels, the conv wants 3


def test_supported_ops_lists_the_families():
    ops = supported_ops()
    assert ops == sorted(ops)
    for name in (
        "Conv",
        "MatMul",
        "LayerNormalization",
        "LSTM",
        "GRU",
        "If",
        "Loop",
        "Resize",
        "QuantizeLinear",
    ):
        assert name in ops


def test_import_does_not_load_torch_and_missing_torch_is_one_error():
    code = (
        "import sys\n"
        "import modelpress.runtime.torch_backend as tb\n"
        "assert 'torch' not in sys.modules, 'torch imported eagerly'\n"
        "sys.modules['torch'] = None\n"  # as if torch were not installed
        "from modelpress.runtime.backend import get_backend\n"
        "from modelpress.errors import MissingExtraError\n"
        "try:\n"
        "    get_backend('torch')\n"
        "except MissingExtraError as e:\n"
        "    print('ERR', e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "ERR" in out and "modelpress[torch]" in out
    assert MissingExtraError  # the class the subprocess raised


def shape_chain_model():
    """Reshape targets computed from Shape at run time, the way exporters write them."""
    from mp_testing import model_from_text

    return model_from_text(
        """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[B, T, 8] x) => (float[B, T, 2, 4] heads, float[B, 8, T] back, int64[3] dims) {
        shp = Shape(x)
        b = Gather <axis = 0> (shp, i0)
        t = Gather <axis = 0> (shp, im2)
        bu = Unsqueeze(b, ax0)
        tu = Unsqueeze(t, ax0)
        target = Concat <axis = 0> (bu, tu, two, minus1)
        heads = Reshape(x, target)
        tt = Mul(t, one)
        ttu = Unsqueeze(tt, ax0)
        eight = Div(sixteen, two)
        target2 = Concat <axis = 0> (bu, eight, ttu)
        flat = Transpose <perm = [0, 2, 1]> (x)
        back = Reshape(flat, target2)
        dims = Shape <start = -3> (heads)
    }
    """.replace(
            "{\n        shp",
            "<int64 i0 = {0}, int64 im2 = {-2}, int64[1] ax0 = {0}, int64[1] two = {2}, "
            "int64[1] minus1 = {-1}, int64 one = {1}, int64[1] sixteen = {16}> {\n        shp",
        )
    )


def test_runtime_shape_chains_match_ort():
    model = shape_chain_model()
    for batch, seq in ((2, 5), (3, 1)):
        x = np.random.default_rng(batch).standard_normal((batch, seq, 8)).astype(np.float32)
        _assert_matches_ort(model, {"x": x})


@pytest.mark.parametrize("which", ["cnn", "transformer", "shape_chain"])
def test_static_graphs_trace_without_graph_breaks(rng, which):
    # TorchDynamo must see the whole graph walk as one graph when input shapes are static, shape
    # arithmetic computed at run time included
    if which == "cnn":
        module, args = to_torch(cnn_model(rng)), {"x": torch.randn(2, 3, 15, 15)}
    elif which == "shape_chain":
        module, args = to_torch(shape_chain_model()), {"x": torch.randn(2, 5, 8)}
    else:
        module = to_torch(transformer_model(rng))
        args = {k: torch.from_numpy(v) for k, v in transformer_feeds(rng).items()}
    torch._dynamo.reset()
    explained = torch._dynamo.explain(module)(**args)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


@pytest.mark.slow
def test_compiled_backend_matches_ort(rng):
    model = cnn_model(rng)
    prepared = get_backend("torch").prepare(model, compile=True)
    assert (
        prepared.module._compiled_call_impl is not None
    )  # run() goes through the compiled forward
    x = rng.standard_normal((2, 3, 15, 15)).astype(np.float32)
    np.testing.assert_allclose(
        prepared.run({"x": x})["logits"], run_model(model, {"x": x})["logits"], rtol=1e-5, atol=1e-5
    )


def test_export_after_training_with_subgraphs_matches_module():
    from modelpress.zoo.control_flow import build_proto

    model = from_proto(build_proto())
    module = to_torch(model)
    with torch.no_grad():
        for p in module.parameters():  # stands in for training: every weight changes
            p.mul_(1.5).add_(0.1)
    x = np.random.default_rng(3).standard_normal((2, 16)).astype(np.float32)
    with torch.no_grad():
        expected = [t.numpy() for t in module(torch.from_numpy(x))]
    got = run_model(to_onnx(module), {"x": x})
    for name, e in zip(module.output_names, expected, strict=True):
        np.testing.assert_allclose(got[name], e, rtol=1e-5, atol=1e-5)


def test_ops_command_lists_ops_and_a_models_missing_ones(tmp_path, capsys):
    from mp_testing import model_from_text

    from modelpress.cli.main import main
    from modelpress.ir import save

    assert main(["ops", "--backend", "torch", "--json", str(tmp_path / "ops.json")]) == 0
    out = capsys.readouterr().out
    assert "LSTM" in out and "Resize" in out
    import json

    record = json.loads((tmp_path / "ops.json").read_text())
    assert record["command"] == "ops" and record["result"]["ops"] == supported_ops()
    path = save(
        model_from_text("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[4] x) => (float[M] y) {
        a = Relu(x)
        y = Unique(a)
    }
    """),
        tmp_path / "m.onnx",
    )
    assert main(["ops", str(path)]) == 0
    assert "1 of 2 op types not supported by torch: Unique" in " ".join(
        capsys.readouterr().out.split()
    )
    assert main(["ops", "--model", str(path)]) == 0  # the old spelling, hidden
    assert "1 of 2 op types not supported by torch: Unique" in " ".join(
        capsys.readouterr().out.split()
    )
    assert main(["ops", str(tmp_path / "missing.onnx")]) == 1
    assert "missing.onnx" in capsys.readouterr().err


def test_concurrent_runs_with_different_shapes_do_not_interfere():
    # a server runs one prepared model from several threads; per-run shape values must not leak
    from concurrent.futures import ThreadPoolExecutor

    model = shape_chain_model()
    prepared = get_backend("torch").prepare(model)
    feeds = [
        {"x": np.random.default_rng(b).standard_normal((b, 2 + b, 8)).astype(np.float32)}
        for b in (1, 2, 3, 4) * 5
    ]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(prepared.run, feeds))
    for f, got in zip(feeds, results, strict=True):
        ref = run_model(model, f)
        for name in ref:
            np.testing.assert_array_equal(got[name], ref[name])


@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("to", ["FLOAT8E4M3FN", "FLOAT8E5M2", "FLOAT8E4M3FNUZ", "FLOAT8E5M2FNUZ"])
def test_float8_cast_overflow_follows_onnx_on_every_device(to, saturate):
    # values at and around each type's largest finite value, its rounding ties, and infinities:
    # PyTorch's own cast saturates on the CPU and gives NaN on CUDA, ONNX says which (saturate)
    from onnx.reference import ReferenceEvaluator

    from modelpress.ir import to_proto

    elem = getattr(onnx.TensorProto, to)
    top = float(torch.finfo(getattr(torch, "float8_" + to[6:].lower())).max)
    x = np.array(
        [
            0.0,
            -0.0,
            1.0,
            0.3,
            top,
            -top,
            top * 1.03,
            top * 1.0625,
            top * 1.07,
            top * 1.072,
            top * 1.14,
            -top * 1.15,
            1e9,
            np.inf,
            -np.inf,
            np.nan,
        ],
        np.float32,
    )
    model = _model(
        [oh.make_node("Cast", ["x"], ["y"], to=elem, saturate=saturate)],
        [_vi("x", onnx.TensorProto.FLOAT, [len(x)])],
        [_vi("y", elem, [len(x)])],
        {},
        opset=21,
    )
    proto = to_proto(model)
    expected = ReferenceEvaluator(proto).run(None, {"x": x})[0].astype(np.float32)
    devices = ["cpu"] + (["cuda:0"] if torch.cuda.is_available() else [])
    for device in devices:
        module = to_torch(model, device=device)
        with torch.no_grad():
            got = module(x=torch.from_numpy(x).to(device)).float().cpu().numpy()
        np.testing.assert_array_equal(got, expected, err_msg=f"{to} saturate={saturate} {device}")
