"""An obfuscated model written without encryption is signed: edited weights, a library swapped in
from another model protected with the same key, a graph edited, a truncated file and a wrong key
are each refused with one line (library and CLI), and the untouched file opens and agrees with
the original."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from protect_models import sample_inputs

from modelpress.cli.main import main
from modelpress.ir import load, save
from modelpress.protect import PackageError, open_package, protect
from modelpress.protect.library import LIBRARY_INIT
from modelpress.protect.signature import SIGNATURE_META
from modelpress.runtime.ort import session


@pytest.fixture(scope="module")
def signed(zoo_paths, tmp_path_factory):
    folder = tmp_path_factory.mktemp("signed")
    key = bytes(range(32))
    key_file = folder / "key.bin"
    key_file.write_bytes(key)
    paths = {}
    for name in ("resnet-digits", "bert-tiny"):
        paths[name] = folder / f"{name}.onnx"
        protect(zoo_paths[name], key=key, output=paths[name], obfuscate=True, encrypt=False, seed=1)
    return key, key_file, paths, folder


def _refused(path, key, capsys, phrase):
    with pytest.raises(PackageError, match=phrase):
        open_package(path, key)
    code = main(["inspect", str(path), "--key-file", str(_refused.key_file)])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: ") and phrase in err and err.count("\n") == 1


def test_the_untouched_file_opens_and_agrees(signed, zoo_paths):
    key, _, paths, _ = signed
    feeds = sample_inputs("resnet-digits")
    want = session(load(zoo_paths["resnet-digits"])).run(None, feeds)[0]
    got = session(open_package(paths["resnet-digits"], key)).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert SIGNATURE_META in {p.key for p in onnx.load(str(paths["resnet-digits"])).metadata_props}


def _edit(src, dst, change) -> None:
    proto = onnx.load(str(src))
    change(proto)
    onnx.save(proto, str(dst))


def _one_weight_element(proto) -> None:
    t = next(t for t in proto.graph.initializer if t.name != LIBRARY_INIT and t.raw_data)
    raw = bytearray(t.raw_data)
    raw[len(raw) // 2] ^= 1
    t.raw_data = bytes(raw)


def _library_of(other):
    def swap(proto) -> None:
        theirs = next(t for t in onnx.load(str(other)).graph.initializer if t.name == LIBRARY_INIT)
        mine = next(t for t in proto.graph.initializer if t.name == LIBRARY_INIT)
        mine.CopyFrom(theirs)

    return swap


def _graph_edit(proto) -> None:
    node = next(n for n in proto.graph.node if len(n.input) >= 2)  # two edges swapped
    node.input[0], node.input[1] = node.input[1], node.input[0]


@pytest.mark.parametrize("how", ["weight", "library", "graph"])
def test_edits_are_refused(signed, tmp_path, capsys, how):
    key, key_file, paths, folder = signed
    _refused.key_file = key_file
    change = {
        "weight": _one_weight_element,
        "library": _library_of(paths["bert-tiny"]),
        "graph": _graph_edit,
    }[how]
    dst = tmp_path / "edited.onnx"
    _edit(paths["resnet-digits"], dst, change)
    _refused(dst, key, capsys, "signature does not match")


def test_a_truncated_file_is_refused(signed, tmp_path, capsys):
    key, key_file, paths, _ = signed
    _refused.key_file = key_file
    data = paths["resnet-digits"].read_bytes()
    dst = tmp_path / "cut.onnx"
    dst.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(Exception) as info:
        open_package(dst, key)
    assert "\n" not in str(info.value)
    code = main(["inspect", str(dst), "--key-file", str(key_file)])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: ") and err.count("\n") == 1


def test_a_wrong_key_and_a_removed_signature_are_refused(signed, tmp_path):
    key, _, paths, _ = signed
    with pytest.raises(PackageError, match="signature does not match"):
        open_package(paths["resnet-digits"], bytes(32))
    model = load(paths["resnet-digits"])
    del model.metadata_props[SIGNATURE_META]
    save(model, tmp_path / "unsigned.onnx")
    with pytest.raises(PackageError, match="not signed"):
        open_package(tmp_path / "unsigned.onnx", key)
