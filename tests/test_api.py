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
