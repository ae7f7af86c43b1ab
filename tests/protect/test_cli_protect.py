"""The CLI: keygen, protect, and every command that reads a model opening .mpk packages with
--key-file/--key-env; each refusal (wrong key, a flipped bit, truncation, not a package, no key)
is one `error:` line and exit code 1; and nothing decrypted is ever written to disk."""

from __future__ import annotations

import builtins
import json
import os
import stat
import tempfile

import numpy as np
import pytest
from protect_models import sample_inputs

from modelpress.cli.main import main

PHRASES = {
    "wrong key": "wrong key or the file was modified",
    "flipped": "wrong key or the file was modified",
    "truncated": "truncated",
    "not a package": "not a modelpress package",
    "no key": "give its key with --key-file",
}


def _cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def packaged(zoo_paths, tmp_path_factory):
    """A key and resnet-digits protected three ways, through the CLI."""
    folder = tmp_path_factory.mktemp("cli")
    key = folder / "key.bin"
    assert main(["keygen", "-o", str(key)]) == 0
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    paths = {
        "plain": folder / "plain.mpk",
        "runtime": folder / "runtime.mpk",
        "storage": folder / "storage.mpk",
        "onnx": folder / "obf.onnx",
    }
    src = str(zoo_paths["resnet-digits"])
    assert main(["protect", src, "-o", str(paths["plain"]), "--key-file", str(key)]) == 0
    assert (
        main(
            [
                "protect",
                src,
                "-o",
                str(paths["runtime"]),
                "--key-file",
                str(key),
                "--obfuscate",
                "--json",
                str(folder / "rec.json"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "protect",
                src,
                "-o",
                str(paths["storage"]),
                "--key-file",
                str(key),
                "--obfuscate",
                "--mode",
                "storage",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "protect",
                src,
                "-o",
                str(paths["onnx"]),
                "--key-file",
                str(key),
                "--obfuscate",
                "--no-encrypt",
                "--ratio",
                "0.6",
            ]
        )
        == 0
    )
    inputs = folder / "in.npz"
    np.savez(inputs, **sample_inputs("resnet-digits", batch=4))
    return folder, key, paths, inputs


@pytest.mark.parametrize("kind", ["plain", "runtime", "storage", "onnx"])
def test_run_opens_every_kind_with_the_key(packaged, zoo_paths, capsys, kind):
    folder, key, paths, inputs = packaged
    code, _, err = _cli(
        capsys, "run", zoo_paths["resnet-digits"], inputs, "-o", folder / "want.npz"
    )
    assert code == 0, err
    code, out, err = _cli(
        capsys, "run", paths[kind], inputs, "-o", folder / f"{kind}.npz", "--key-file", key
    )
    assert code == 0, err
    want, got = np.load(folder / "want.npz"), np.load(folder / f"{kind}.npz")
    for name in want.files:
        # runtime mode's layers add their products in another channel order: float rounding
        scale = float(np.abs(want[name]).max())
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6 * scale)


def test_the_key_from_the_environment(packaged, capsys, monkeypatch):
    folder, key, paths, inputs = packaged
    monkeypatch.setenv("MP_CLI_KEY", key.read_bytes().hex())
    code, _, err = _cli(
        capsys, "run", paths["runtime"], inputs, "-o", folder / "env.npz", "--key-env", "MP_CLI_KEY"
    )
    assert code == 0, err


def test_verify_inspect_and_bench_accept_packages(packaged, zoo_paths, capsys):
    folder, key, paths, _ = packaged
    code, out, _ = _cli(
        capsys, "verify", zoo_paths["resnet-digits"], paths["storage"], "--key-file", key
    )
    assert code == 0 and "PASS" in out
    code, out, _ = _cli(capsys, "verify", paths["plain"], paths["runtime"], "--key-file", key)
    assert code == 0 and "PASS" in out
    code, out, _ = _cli(
        capsys, "inspect", paths["storage"], "--key-file", key, "--json", folder / "inspect.json"
    )
    assert code == 0 and "Conv" in out  # storage mode: the original, in memory
    assert json.loads((folder / "inspect.json").read_text())["result"]["op_counts"]["Conv"] == 9
    code, out, _ = _cli(capsys, "inspect", paths["onnx"])  # no key: what the file shows
    assert code == 0 and "Conv" not in out
    code, out, err = _cli(
        capsys,
        "bench",
        paths["runtime"],
        "--vs",
        zoo_paths["resnet-digits"],
        "--key-file",
        key,
        "--runs",
        "3",
        "--json",
        folder / "bench.json",
    )
    assert code == 0, err
    models = json.loads((folder / "bench.json").read_text())["result"]["models"]
    assert [m["model"] for m in models] == [str(paths["runtime"]), str(zoo_paths["resnet-digits"])]


def test_the_protect_record_holds_the_measured_protection(packaged):
    folder, *_ = packaged
    record = json.loads((folder / "rec.json").read_text())
    assert record["command"] == "protect"
    result = record["result"]
    assert result["metrics"]["anonymous_share"] == 1.0 and result["verification"]["passed"]
    assert "data" not in result and record["options"]["key_file"].endswith("key.bin")


def _refusal(tmp_path, paths, key, case):
    """(package path, key option) for each way of being refused."""
    blob = paths["runtime"].read_bytes()
    bad = tmp_path / f"{case.replace(' ', '_')}.mpk"
    options = ["--key-file", key]
    if case == "wrong key":
        other = tmp_path / "other.bin"
        other.write_bytes(os.urandom(32))
        bad.write_bytes(blob)
        options = ["--key-file", other]
    elif case == "flipped":
        changed = bytearray(blob)
        changed[len(blob) // 2] ^= 0x10
        bad.write_bytes(bytes(changed))
    elif case == "truncated":
        bad.write_bytes(blob[: len(blob) - 100])
    elif case == "not a package":
        bad.write_bytes(b"PK\x03\x04 this is a zip, not a model" * 10)
    elif case == "no key":
        bad.write_bytes(blob)
        options = []
    return bad, options


@pytest.mark.parametrize("command", ["run", "inspect", "verify", "bench"])
@pytest.mark.parametrize("case", list(PHRASES))
def test_refusals_are_one_line_and_exit_1(packaged, zoo_paths, tmp_path, capsys, command, case):
    folder, key, paths, inputs = packaged
    bad, options = _refusal(tmp_path, paths, key, case)
    argv = {
        "run": ["run", bad, inputs, "-o", tmp_path / "out.npz"],
        "inspect": ["inspect", bad],
        "verify": ["verify", zoo_paths["resnet-digits"], bad],
        "bench": ["bench", bad, "--runs", "2"],
    }[command]
    code, out, err = _cli(capsys, *argv, *options)
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and PHRASES[case] in lines[0], err
    assert "Traceback" not in err + out
    assert not (tmp_path / "out.npz").exists()


def test_protect_refusals_write_nothing(zoo_paths, tmp_path, capsys):
    key = tmp_path / "k.bin"
    main(["keygen", "-o", str(key)])
    out = tmp_path / "m.mpk"
    out.write_bytes(b"keep me")
    for argv in (
        ["--ratio", "0.3"],  # without --obfuscate
        ["--obfuscate", "--ratio", "1.5"],
        ["--no-encrypt"],
        ["--mode", "runtime"],
    ):
        code, _, err = _cli(
            capsys, "protect", zoo_paths["resnet-digits"], "-o", out, "--key-file", key, *argv
        )
        assert code == 1 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, (
            argv,
            err,
        )
    code, _, err = _cli(capsys, "protect", zoo_paths["resnet-digits"], "-o", out)
    assert code == 1 and "needs a key" in err
    assert out.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.bin", "m.mpk"]


def test_keygen_refuses_to_overwrite(tmp_path, capsys):
    key = tmp_path / "k.bin"
    assert _cli(capsys, "keygen", "-o", key, "--json", tmp_path / "k.json")[0] == 0
    record = (tmp_path / "k.json").read_text()
    assert json.loads(record)["result"]["key_id"] and key.read_bytes().hex() not in record
    code, _, err = _cli(capsys, "keygen", "-o", key)
    assert code == 1 and "already there" in err


def test_no_plaintext_reaches_the_disk(packaged, zoo_paths, tmp_path, capsys, monkeypatch):
    """Opening and running packages writes only the outputs asked for: every file opened for
    writing is recorded, and the temporary and output folders are searched for the model's bytes."""
    folder, key, paths, inputs = packaged
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    written: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def watching_open(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+"):
            written.append(str(file))
        return real_open(file, mode, *args, **kwargs)

    def watching_os_open(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            written.append(str(path))
        return real_os_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", watching_open)
    monkeypatch.setattr(os, "open", watching_os_open)
    out_dir = tmp_path / "outputs"
    out_dir.mkdir()
    for kind in ("plain", "runtime", "storage"):
        assert (
            _cli(
                capsys, "run", paths[kind], inputs, "-o", out_dir / f"{kind}.npz", "--key-file", key
            )[0]
            == 0
        )
        assert _cli(capsys, "inspect", paths[kind], "--key-file", key)[0] == 0
    monkeypatch.setattr(builtins, "open", real_open)
    monkeypatch.setattr(os, "open", real_os_open)

    # only the three .npz outputs (each written under a temporary name, then renamed)
    assert all(".npz" in w for w in written), written
    assert sorted(p.name for p in out_dir.iterdir()) == ["plain.npz", "runtime.npz", "storage.npz"]
    assert list(scratch.iterdir()) == []
    # and no file there holds the model: its weights' bytes or its node names
    import onnx

    original = onnx.load(str(zoo_paths["resnet-digits"]))
    needles = [t.raw_data[:64] for t in original.graph.initializer if len(t.raw_data) >= 64][:5]
    needles += [n.name.encode() for n in original.graph.node if len(n.name) >= 8][:5]
    assert needles
    for path in [*out_dir.iterdir(), *scratch.rglob("*")]:
        data = path.read_bytes()
        assert not any(n in data for n in needles), path


def test_an_obfuscated_onnx_file_needs_its_key_to_run(packaged, tmp_path, capsys):
    folder, key, paths, inputs = packaged
    code, _, err = _cli(capsys, "run", paths["onnx"], inputs, "-o", tmp_path / "o.npz")
    assert (
        code == 1
        and "an obfuscated model: give its key" in err
        and len(err.strip().splitlines()) == 1
    )
    other = tmp_path / "other.bin"
    other.write_bytes(os.urandom(32))
    code, _, err = _cli(
        capsys, "run", paths["onnx"], inputs, "-o", tmp_path / "o.npz", "--key-file", other
    )
    assert code == 1 and "wrong key or the file was modified" in err
