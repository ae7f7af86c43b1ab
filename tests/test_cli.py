"""The ``modelpress`` command: every ``--help`` works, and bad input gets one error line.

A user's mistake must give exit code 1, exactly one line on stderr starting with ``error:``, no
traceback, and no output file (partial or temporary) left behind; an existing output stays as it was.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from mp_testing import model_from_text

from modelpress.cli.main import build_parser, main
from modelpress.ir import save

TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4] x) => (float[N, 4] y) <float[4, 4] w = {1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 3, 0, 0, 0, 0, 4}, float[4] b = {1, 1, 1, 1}> {
  i = Identity(x)
  m = MatMul(i, w)
  y = Add(m, b)
}
"""
# A graph the ONNX checker refuses: the node reads a value nothing defines.
INVALID_TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4] x) => (float[N, 4] y) {
  y = Add(x, undefined_value)
}
"""
CONSOLE_SCRIPT = Path(sys.executable).parent / "modelpress"


def _subcommands() -> list[str]:
    parser = build_parser()
    for action in parser._actions:  # argparse keeps its subparsers here and nowhere public
        if isinstance(action, argparse._SubParsersAction):
            return sorted(action.choices)
    return []


@pytest.fixture
def model(tmp_path) -> Path:
    return save(model_from_text(TEXT), tmp_path / "model.onnx")


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("error: "), err
    assert "\n" not in err and "Traceback" not in captured.err + captured.out
    return err


def test_top_level_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    names = _subcommands()
    assert {"inspect", "optimize", "verify"} <= set(names)
    for name in names:
        assert f"\n    {name} " in out or f"\n    {name}\n" in out, name


@pytest.mark.parametrize("command", _subcommands())
def test_subcommand_help(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: modelpress {command}")


def test_optimize_help_lists_the_registered_passes(capsys):
    from modelpress.passes import REGISTRY

    with pytest.raises(SystemExit):
        main(["optimize", "--help"])
    out = capsys.readouterr().out
    for name in REGISTRY:
        assert name in out


def test_console_script_runs():
    if not CONSOLE_SCRIPT.exists():
        pytest.skip("the modelpress console script is not installed in this environment")
    proc = subprocess.run(
        [str(CONSOLE_SCRIPT), "--version"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and proc.stdout.startswith("modelpress ")


def _bad_inputs(tmp_path: Path, model: Path) -> dict[str, tuple[Path, str]]:
    """Bad input file -> (path, a phrase the error line must contain)."""
    truncated = tmp_path / "truncated.onnx"
    data = model.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    text = tmp_path / "notes.onnx"
    text.write_text("this is not an ONNX model\n")
    invalid = tmp_path / "invalid.onnx"
    invalid.write_bytes(onnx.parser.parse_model(INVALID_TEXT).SerializeToString())
    return {
        "truncated": (truncated, "truncated.onnx"),
        "not-onnx": (text, "notes.onnx"),
        "invalid-graph": (invalid, "invalid.onnx"),
        "missing": (tmp_path / "absent.onnx", "absent.onnx"),
        "directory": (tmp_path, "directory"),
    }


@pytest.mark.parametrize("kind", ["truncated", "not-onnx", "invalid-graph", "missing", "directory"])
def test_optimize_bad_input_file(kind, tmp_path, model, capsys):
    path, phrase = _bad_inputs(tmp_path, model)[kind]
    out = tmp_path / "out.onnx"
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["optimize", str(path), "-o", str(out)]) == 1
    assert phrase in _one_error_line(capsys)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no temporary files left


def test_optimize_output_in_missing_directory(tmp_path, model, capsys):
    out = tmp_path / "no" / "such" / "dir" / "out.onnx"
    assert main(["optimize", str(model), "-o", str(out)]) == 1
    assert "does not exist" in _one_error_line(capsys)
    assert not out.parent.exists()


def test_failed_optimize_leaves_an_existing_output_as_it_was(tmp_path, model, capsys):
    out = tmp_path / "out.onnx"
    out.write_bytes(b"previous result")
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(model.read_bytes()[:40])
    assert main(["optimize", str(truncated), "-o", str(out)]) == 1
    _one_error_line(capsys)
    assert out.read_bytes() == b"previous result"


@pytest.mark.parametrize(
    "argv, phrase",
    [
        (["optimize", "{model}", "-o", "{out}", "--passes", "no-such-pass"], "no-such-pass"),
        (["optimize", "{model}", "-o", "{out}", "--skip", "no-such-pass"], "no-such-pass"),
        (["inspect", "{missing}"], "absent.onnx"),
        (["verify", "{model}", "{missing}"], "absent.onnx"),
    ],
)
def test_other_mistakes_give_one_error_line(argv, phrase, tmp_path, model, capsys):
    out = tmp_path / "out.onnx"
    args = [a.format(model=model, out=out, missing=tmp_path / "absent.onnx") for a in argv]
    assert main(args) == 1
    assert phrase in _one_error_line(capsys)
    assert not out.exists()


def test_optimize_good_input_writes_a_verified_model(tmp_path, model, capsys):
    # The counterpart of the error tests: the same command on a valid file succeeds.
    from modelpress.verify import run_model

    out = tmp_path / "out.onnx"
    assert main(["optimize", str(model), "-o", str(out)]) == 0
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    want = x @ np.diag([1.0, 2.0, 3.0, 4.0]).astype(np.float32) + 1.0
    np.testing.assert_allclose(run_model(out, {"x": x})["y"], want, rtol=1e-6)


def test_console_script_bad_input_has_no_traceback(tmp_path):
    if not CONSOLE_SCRIPT.exists():
        pytest.skip("the modelpress console script is not installed in this environment")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage")
    proc = subprocess.run(
        [str(CONSOLE_SCRIPT), "optimize", str(bad), "-o", str(tmp_path / "out.onnx")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out.onnx").exists()


def test_help_loads_no_optional_extra():
    """``modelpress --help`` and every command's parser load no heavy optional extra: the
    frameworks, Ray, the server and the plotting stack are imported by the commands that use them."""
    import subprocess
    import sys

    code = (
        "import sys; from modelpress.cli.main import build_parser; build_parser(); "
        "print(','.join(m for m in ('torch', 'tensorflow', 'ray', 'fastapi', 'matplotlib', 'cryptography') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""
