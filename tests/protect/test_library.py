"""The operator library sealed inside an obfuscated ONNX file: a wrong key, any changed byte in
it, a missing library or a library moved from another model are refused with one line."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from modelpress.errors import ModelLoadError
from modelpress.ir import from_proto, save
from modelpress.protect import PackageError, is_package, open_package, protect, signature
from modelpress.protect.library import LIBRARY_INIT


@pytest.fixture(scope="module")
def obfuscated(zoo_paths, tmp_path_factory):
    key = os.urandom(32)
    folder = tmp_path_factory.mktemp("library")
    paths = {}
    for mode in ("runtime", "storage"):
        paths[mode] = folder / f"{mode}.onnx"
        protect(
            zoo_paths["resnet-digits"],
            key=key,
            output=paths[mode],
            obfuscate=True,
            encrypt=False,
            mode=mode,
            verify=False,
        )
    return key, paths


def _with_library(path, tmp_path, change, key) -> str:
    """The model at ``path`` with its library changed, then signed again with ``key`` (as a key
    holder could): what is left to refuse it is the library's own seal."""
    proto = onnx.load(str(path))
    init = next(t for t in proto.graph.initializer if t.name == LIBRARY_INIT)
    blob = numpy_helper.to_array(init).copy()
    new = change(blob)
    init.CopyFrom(numpy_helper.from_array(np.asarray(new, dtype=np.uint8), LIBRARY_INIT))
    out = tmp_path / "changed.onnx"
    save(signature.sign(from_proto(proto), key), out)
    return out


@pytest.mark.parametrize("mode", ["runtime", "storage"])
def test_the_library_opens_only_with_its_key(obfuscated, mode):
    key, paths = obfuscated
    assert is_package(paths[mode])
    open_package(paths[mode], key)
    with pytest.raises(PackageError, match="wrong key or the file was modified"):
        open_package(paths[mode], os.urandom(32))


def test_every_changed_library_byte_is_refused(obfuscated, tmp_path):
    key, paths = obfuscated
    rng = np.random.default_rng(0)
    size = len(
        numpy_helper.to_array(
            next(
                t
                for t in onnx.load(str(paths["runtime"])).graph.initializer
                if t.name == LIBRARY_INIT
            )
        )
    )
    for offset in rng.integers(0, size, size=40):

        def flip(b, o=int(offset)):
            b[o] ^= 1 << int(rng.integers(8))
            return b

        with pytest.raises(PackageError) as info:
            open_package(_with_library(paths["runtime"], tmp_path, flip, key), key)
        assert "\n" not in str(info.value) and "operator library" in str(info.value)


def test_a_truncated_or_swapped_library_is_refused(obfuscated, tmp_path):
    key, paths = obfuscated
    with pytest.raises(PackageError, match="truncated"):
        open_package(_with_library(paths["runtime"], tmp_path, lambda b: b[:-10], key), key)
    other = numpy_helper.to_array(
        next(
            t for t in onnx.load(str(paths["storage"])).graph.initializer if t.name == LIBRARY_INIT
        )
    )
    swapped = _with_library(paths["runtime"], tmp_path, lambda b: other, key)
    with pytest.raises(
        ModelLoadError
    ):  # storage skeleton over a runtime graph: its weights are not there
        open_package(swapped, key)


def test_a_plain_onnx_file_is_no_package(zoo_paths, key):
    assert not is_package(zoo_paths["resnet-digits"])
    model = open_package(zoo_paths["resnet-digits"], key)  # nothing to open: the model as it is
    assert len(model.graph) > 10
