"""The optimizer as a whole: a small CNN shrinks and still computes the same; bad pass names fail."""

from __future__ import annotations

import importlib
import pkgutil

import numpy as np
import pytest
from mp_testing import assert_graph_equal, init, model_from_text

import modelpress.passes
from modelpress import optimize, save
from modelpress.cli.main import main
from modelpress.errors import OptionError
from modelpress.ir import graph_stats
from modelpress.passes import PIPELINE, REGISTRY
from modelpress.passes.base import GraphPass
from modelpress.passes.registry import for_level
from modelpress.verify import verify


def lit(a) -> str:
    return "{" + ",".join(repr(float(v)) for v in np.ravel(a)) + "}"


def cnn_params():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)) * 0.3
    scale, bias, mean = rng.standard_normal((3, 4))
    var = rng.uniform(0.2, 2.0, 4)
    return w, scale, bias, mean, var


def cnn_text() -> str:
    w, scale, bias, mean, var = cnn_params()
    return f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, 8, 8] x) => (float[N, 4, 8, 8] y)
    <float[4, 3, 3, 3] w = {lit(w)}, float[4] s = {lit(scale)}, float[4] b = {lit(bias)},
     float[4] mu = {lit(mean)}, float[4] var = {lit(var)}, float one = {{1.0}}> {{
      c = Conv<pads = [1, 1, 1, 1]>(x, w)
      n = BatchNormalization(c, s, b, mu, var)
      r = Relu(n)
      i = Identity(r)
      d = Dropout(i)
      y = Mul(d, one)
    }}
    """


def test_level2_shrinks_a_conv_bn_relu_model_and_it_verifies():
    before = model_from_text(cnn_text())
    result = optimize(model_from_text(cnn_text()), level=2)
    after = result.model
    # Conv+BN fuse; Identity, Dropout and the Mul by one go.
    assert graph_stats(after).node_count < graph_stats(before).node_count
    w, scale, bias, mean, var = (np.asarray(a, np.float32).astype(np.float64) for a in cnn_params())
    k = scale / np.sqrt(var + 1e-5)
    assert_graph_equal(
        after,
        f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 3, 8, 8] x) => (float[N, 4, 8, 8] y) <{init("w", w * k[:, None, None, None])}, {init("b", bias - mean * k)}> {{
          c = Conv<pads = [1, 1, 1, 1]>(x, w, b)
          y = Relu(c)
        }}
        """,
    )
    for n in (1, 3):
        res = verify(before, after, dims={"N": n}, rtol=1e-5, atol=1e-5)
        assert res.passed, res
    assert result.rewrites == sum(p.rewrites for p in result.passes) > 0


def test_level1_runs_only_level1_passes():
    result = optimize(model_from_text(cnn_text()), level=1)
    names = {p.name for p in result.passes}
    assert {"noop", "constant-folding"} <= names
    assert not {"batchnorm-to-scale", "merge-scale-chains"} & names


@pytest.mark.parametrize("option", ["passes", "skip"])
def test_unknown_pass_name_is_an_option_error(option):
    with pytest.raises(OptionError, match="no-such-pass"):
        optimize(model_from_text(cnn_text()), **{option: ["no-such-pass"]})


@pytest.mark.parametrize("flag", ["--passes", "--skip"])
def test_cli_unknown_pass_is_one_error_line_and_no_output(tmp_path, capsys, flag):
    src = save(model_from_text(cnn_text()), tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    code = main(["optimize", str(src), "-o", str(out), flag, "no-such-pass"])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.startswith("error:") and "no-such-pass" in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_the_pipeline_is_the_registry_in_order():
    assert list(REGISTRY) == [cls.name for cls in PIPELINE]
    assert [cls.name for cls in for_level(1)] == [cls.name for cls in PIPELINE if cls.level == 1]
    # levels nest: each level runs the passes of the ones below it, in pipeline order
    for level in (1, 2):
        below = [cls.name for cls in for_level(level)]
        assert [n for n in (cls.name for cls in for_level(level + 1)) if n in below] == below


def test_every_pass_class_is_in_the_pipeline():
    """A pass written but not listed in PIPELINE would never run: each module's passes are listed."""
    found = set()
    for info in pkgutil.iter_modules(modelpress.passes.__path__):
        module = importlib.import_module(f"modelpress.passes.{info.name}")
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and issubclass(obj, GraphPass)
                and obj.name
                and obj.__module__ == module.__name__
            ):
                found.add(obj)
    assert found == set(PIPELINE)
