"""Fixtures of the protect tests: the models protected (built once per session) and a key.
Model builders live in ``protect_models``."""

from __future__ import annotations

import os

import onnx
import pytest
from protect_models import ZOO, lstm_proto

from modelpress import zoo
from modelpress.ir import from_proto


@pytest.fixture(scope="session")
def zoo_paths(tmp_path_factory):
    folder = tmp_path_factory.mktemp("protect-zoo")
    paths = {name: zoo.build(name, folder / f"{name}.onnx") for name in ZOO}
    paths["lstm"] = folder / "lstm.onnx"
    onnx.save(lstm_proto(), str(paths["lstm"]))
    return paths


@pytest.fixture
def key() -> bytes:
    return os.urandom(32)


@pytest.fixture(scope="session")
def lstm_model():
    return from_proto(lstm_proto())
