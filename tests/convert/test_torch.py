"""PyTorch → ONNX: modules, .pt2 programs and TorchScript files convert and match PyTorch.

Every conversion is verified inside ``convert`` against PyTorch; the tests also check the written
file independently (ONNX Runtime with its optimizations off vs PyTorch on fresh inputs), the graph
structure the conversion must produce (If for torch.cond, Loop for a scripted loop), and that bad
input gives one clear error and writes nothing.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from modelpress.cli.main import main  # noqa: E402
from modelpress.convert import ConversionError, convert  # noqa: E402
from modelpress.errors import OptionError, VerificationError  # noqa: E402
from modelpress.ir import load  # noqa: E402
from modelpress.ir.stats import iter_nodes  # noqa: E402
from modelpress.verify import run_model  # noqa: E402


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        h = torch.relu(self.bn2(self.conv2(h)) + h)  # residual
        return self.head(h.mean(dim=(2, 3)))


class TinyTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 32)
        self.layer = nn.TransformerEncoderLayer(
            32, 4, dim_feedforward=64, batch_first=True, dropout=0.0
        )
        self.out = nn.Linear(32, 3)

    def forward(self, ids):
        return self.out(self.layer(self.embed(ids)).mean(dim=1))


class Branchy(nn.Module):
    """A data-dependent branch, written with torch.cond so torch.export keeps both sides."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        h = self.lin(x)
        return torch.cond(h.sum() > 0, lambda t: t * 2.0, lambda t: torch.tanh(t) - 1.0, (h,))


class Looper(nn.Module):
    """A loop whose trip count is an input value: only scripting keeps it a loop."""

    def forward(self, x, n: torch.Tensor):
        acc = x
        for _ in range(int(n)):
            acc = torch.sin(acc) + x
        return acc


def _init(module: nn.Module, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):  # non-trivial statistics, so a wrong BN shows
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return module.eval()


def _assert_matches_torch(path, module, feeds: dict[str, np.ndarray], rtol=1e-4):
    with torch.no_grad():
        expected = module(*[torch.from_numpy(v) for v in feeds.values()])
    got = next(iter(run_model(load(path), feeds).values()))
    scale = float(np.abs(expected.numpy()).max())
    np.testing.assert_allclose(got, expected.numpy(), rtol=0, atol=rtol * scale)


@pytest.fixture(scope="module")
def cnn():
    return _init(SmallCNN())


def test_cnn_module_dynamic_batch(cnn, tmp_path):
    out = tmp_path / "cnn.onnx"
    r = convert(cnn, example_inputs=(torch.randn(2, 3, 16, 16),), dynamic={"x": 0}, output=out)
    assert r.exporter == "dynamo" and r.verify.passed and r.verify.runs == 3
    x = np.random.default_rng(1).standard_normal((5, 3, 16, 16)).astype(np.float32)
    _assert_matches_torch(out, cnn, {"x": x})
    batch = load(out).graph.inputs[0].shape[0]
    assert not isinstance(batch, int) and batch.value == "x_0"


def test_cnn_optimize_verifies_again(cnn, tmp_path):
    r = convert(
        cnn, example_inputs=(torch.randn(1, 3, 8, 8),), optimize=True, exporter_optimizations=False
    )
    assert r.optimized is not None and r.optimized.rewrites > 0
    assert r.optimized_verify.passed
    ops = {n.op_type for n in r.model.graph}
    assert "BatchNormalization" not in ops  # fused into the convolutions


def test_transformer_module(tmp_path):
    model = _init(TinyTransformer())
    ids = torch.randint(0, 50, (2, 7))
    out = tmp_path / "tr.onnx"
    r = convert(model, example_inputs=(ids,), dynamic={"ids": [0, 1]}, output=out)
    assert r.verify.passed
    feeds = {"ids": np.random.default_rng(2).integers(0, 50, (3, 11)).astype(np.int64)}
    _assert_matches_torch(out, model, feeds)


def test_torch_cond_becomes_if(tmp_path):
    model = _init(Branchy())
    out = tmp_path / "cond.onnx"
    r = convert(model, example_inputs=(torch.randn(6),), output=out)
    assert r.verify.passed
    assert "If" in {n.op_type for n in load(out).graph}
    lin = model.lin
    # inputs chosen to take each branch
    for sign in (1.0, -1.0):
        with torch.no_grad():
            x = (sign * 5.0 - lin.bias) @ torch.linalg.pinv(lin.weight).T
        assert (model.lin(x).sum() > 0) == (sign > 0)
        _assert_matches_torch(out, model, {"x": x.numpy().astype(np.float32)})


def test_scripted_loop_through_cli(tmp_path, capsys):
    scripted = torch.jit.script(Looper())
    src = tmp_path / "loop.pt"
    scripted.save(str(src))
    out = tmp_path / "loop.onnx"
    assert (
        main(["convert", str(src), "-o", str(out), "--shape", "x=2x3", "--shape", "n=:int64"]) == 0
    )
    text = capsys.readouterr().out
    assert "torchscript" in text and "ok" in text
    model = load(out)
    assert "Loop" in {n.op_type for n in iter_nodes(model.graph)}
    x = np.random.default_rng(3).standard_normal((2, 3)).astype(np.float32)
    for n in (0, 1, 4):  # other trip counts than the example's
        feeds = {"x": x, "n": np.array(n, dtype=np.int64)}
        _assert_matches_torch(out, scripted, feeds)


def test_pt2_through_cli(cnn, tmp_path, capsys):
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(cnn, (torch.randn(2, 3, 16, 16),), dynamic_shapes={"x": {0: batch}})
    src = tmp_path / "cnn.pt2"
    torch.export.save(ep, str(src))
    out = tmp_path / "cnn.onnx"
    assert main(["convert", str(src), "-o", str(out), "--optimize"]) == 0
    text = capsys.readouterr().out
    assert "pt2" in text and "optimized ONNX vs original" in text
    x = np.random.default_rng(4).standard_normal((3, 3, 16, 16)).astype(np.float32)
    _assert_matches_torch(out, cnn, {"x": x})


def test_unsupported_op_names_op_and_module():
    @torch.library.custom_op("modelpress_test::scaled", mutates_args=())
    def scaled(x: torch.Tensor) -> torch.Tensor:
        return x * 3.0

    @scaled.register_fake
    def _(x):
        return torch.empty_like(x)

    class Inner(nn.Module):
        def forward(self, x):
            return scaled(x)

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.block = Inner()

        def forward(self, x):
            return self.block(self.lin(x))

    with pytest.raises(ConversionError) as info:
        convert(Outer().eval(), example_inputs=(torch.randn(2, 4),))
    msg = str(info.value)
    assert "\n" not in msg
    assert "modelpress_test.scaled" in msg and "'block'" in msg and "test_torch.py" in msg
    assert "`opset`" in msg  # the API names its keyword; the CLI says --opset


def test_corrupted_pt2(cnn, tmp_path, capsys):
    ep = torch.export.export(cnn, (torch.randn(1, 3, 8, 8),))
    src = tmp_path / "bad.pt2"
    torch.export.save(ep, str(src))
    data = src.read_bytes()
    src.write_bytes(data[: len(data) // 2])
    out = tmp_path / "bad.onnx"
    assert main(["convert", str(src), "-o", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "bad.pt2" in err and "torch.export" in err
    assert len(err.splitlines()) == 1 and not out.exists()


def test_wrong_kind_of_file(tmp_path, capsys):
    src = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(3)}, str(src))  # a state_dict, not TorchScript
    out = tmp_path / "x.onnx"
    assert main(["convert", str(src), "-o", str(out), "--input", "x=1x3"]) == 1
    err = capsys.readouterr().err.strip()
    assert "not a readable TorchScript file" in err and len(err.splitlines()) == 1
    assert not out.exists()
    txt = tmp_path / "notes.txt"
    txt.write_text("hello")
    with pytest.raises(ConversionError, match="not a model modelpress can convert"):
        convert(txt)


def test_torchscript_needs_input_shapes(tmp_path):
    src = tmp_path / "loop.pt"
    torch.jit.script(Looper()).save(str(src))
    with pytest.raises(OptionError, match="`inputs` for x=.*n="):
        convert(src)


def test_bad_options(cnn, tmp_path):
    with pytest.raises(OptionError, match="no input 'image'"):
        convert(cnn, example_inputs=(torch.randn(1, 3, 8, 8),), dynamic={"image": 0})
    with pytest.raises(OptionError, match="does not exist"):
        convert(cnn, example_inputs=(torch.randn(1, 3, 8, 8),), output=tmp_path / "no" / "m.onnx")
    with pytest.raises(OptionError, match="example_inputs"):
        convert(cnn)


class AlwaysPositive(nn.Module):
    """A Python branch on data: torch.export cannot trace it, the TorchScript exporter can."""

    def forward(self, x):
        if x.abs().sum() >= 0:  # always true, but torch.export cannot know
            return torch.relu(x) * 2.0
        return x


class Trap(nn.Module):
    """A Python branch the example takes and random inputs never do: tracing bakes it in."""

    def forward(self, x):
        if x[0, 0] > 100:
            return x * 2.0
        return x - 1.0


def test_fallback_to_torchscript_exporter_with_note():
    r = convert(AlwaysPositive(), inputs={"x": (2, 5)})
    assert r.exporter == "torchscript" and r.verify.passed
    assert any("torch.export could not trace" in n for n in r.notes)
    x = np.random.default_rng(5).standard_normal((2, 5)).astype(np.float32)
    got = next(iter(run_model(r.model, {"x": x}).values()))
    np.testing.assert_allclose(got, np.maximum(x, 0) * 2.0, rtol=1e-6, atol=0)


def test_conversion_that_does_not_verify_is_an_error(tmp_path, capsys):
    x = torch.randn(2, 3)
    x[0, 0] = 1000.0
    out = tmp_path / "trap.onnx"
    with pytest.raises(VerificationError, match="differ"):
        convert(Trap(), example_inputs=(x,), output=out)
    assert not out.exists()
    # the user may insist: then the (wrong) model is written, unverified
    r = convert(Trap(), example_inputs=(x,), output=out, verify=False)
    assert r.verify is None and out.exists()


@pytest.mark.slow
def test_minilm_real_weights(tmp_path):
    from modelpress.zoo import build_torch

    module, args = build_torch("minilm")
    out = tmp_path / "minilm.onnx"
    dyn = {"input_ids": [0, 1], "attention_mask": [0, 1], "token_type_ids": [0, 1]}
    r = convert(module, example_inputs=args, dynamic=dyn, output=out)
    assert r.verify.passed and r.verify.runs == 3
    # real sentences (the example), checked again from the written file
    feeds = dict(
        zip(
            ("input_ids", "attention_mask", "token_type_ids"),
            (a.numpy() for a in args),
            strict=False,
        )
    )
    _assert_matches_torch(out, module, feeds)
