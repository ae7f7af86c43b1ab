"""The top-level API: every name in ``modelpress.__all__`` is the callable it promises, before and
after its subpackage is imported, and on every call (a subpackage import used to shadow
``modelpress.convert``)."""

from __future__ import annotations

import importlib

import modelpress


def test_top_level_names_stay_callable_after_subpackage_imports():
    for sub in ("modelpress.convert", "modelpress.convert.api", "modelpress.compress"):
        importlib.import_module(sub)
    for name in ("convert", "quantize", "advise", "Session", "optimize", "verify", "load", "save"):
        obj = getattr(modelpress, name)
        assert callable(obj) and not isinstance(obj, type(modelpress)), name
        assert getattr(modelpress, name) is obj  # the same object on the second access


def test_convert_twice_in_one_process(tmp_path):
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    x = torch.randn(2, 4)
    for i in range(2):
        result = modelpress.convert(model, example_inputs=(x,))
        assert result.verify is not None and result.verify.passed, i


def test_open_reads_every_form_the_commands_read(tmp_path):
    """modelpress.open: .onnx, .mpz, .mpk and obfuscated ONNX, keys given in Python's words."""
    import os

    import numpy as np
    import pytest

    import modelpress
    from modelpress.errors import OptionError
    from modelpress.ir import parse, save
    from modelpress.protect import protect

    model = parse("""<ir_version: 8, opset_import: ["" : 17]> g (float[N, 4] x) => (float[N, 4] y)
        <float[4, 4] w = {1.0, 0.5, 0.0, 0.0, 0.0, 1.0, 0.5, 0.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.0, 0.0, 1.0}> {
        y = MatMul(x, w)
    }""")
    save(model, tmp_path / "m.onnx")
    key = os.urandom(32)
    (tmp_path / "k.bin").write_bytes(key)
    protect(tmp_path / "m.onnx", output=tmp_path / "m.mpk", key=key)
    protect(tmp_path / "m.onnx", output=tmp_path / "o.onnx", key=key, obfuscate=True, encrypt=False)
    x = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    want = modelpress.Session(modelpress.open(tmp_path / "m.onnx")).run(x)["y"]
    for opened in (
        modelpress.open(tmp_path / "m.mpk", key=key),
        modelpress.open(tmp_path / "m.mpk", key_file=tmp_path / "k.bin"),
        modelpress.open(tmp_path / "o.onnx", key=key),
    ):
        np.testing.assert_array_equal(modelpress.Session(opened).run(x)["y"], want)
    with pytest.raises(OptionError, match="give its key with `key`"):
        modelpress.open(tmp_path / "m.mpk")
    with pytest.raises(OptionError, match="an obfuscated model: give its key"):
        modelpress.open(tmp_path / "o.onnx")
    assert modelpress.open(tmp_path / "o.onnx", runnable=False) is not None


def test_lazily_given_names_resolve_and_are_listed():
    """Packages whose names load on first use (``errors.lazy_exports``) give every name of their
    ``__all__``, list it in ``dir()``, and refuse an unknown one with AttributeError."""
    import pytest

    for package in (
        "modelpress.ir",
        "modelpress.verify",
        "modelpress.deploy",
        "modelpress.cli.options",
    ):
        module = importlib.import_module(package)
        for name in module.__all__:
            assert getattr(module, name) is not None, (package, name)
        assert set(module.__all__) <= set(dir(module)), package
        with pytest.raises(AttributeError, match="no attribute 'nope'"):
            module.nope  # noqa: B018
