"""The CLI routes of LLM folders: quantize --mode int4 and verify A_DIR B_DIR --data."""

import json

import pytest
from llm_convert_testing import tiny_llm

from modelpress.cli.main import main
from modelpress.ir import llm

TEXT = "Quantization trades a little accuracy for speed and memory. Hello world! " * 20


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("llm")
    tiny_llm(tmp, text=TEXT, name="f")
    return tmp


def test_quantize_and_verify(folder, capsys):
    f, q, text = folder / "f", folder / "q", folder / "text.txt"
    argv = ["quantize", str(f), "-o", str(q), "--mode", "int4", "--data", str(text)]
    argv += ["--seq-len", "32", "--limit", "4", "--stages", "2", "--int8-layers", "1"]
    argv += ["--float-zero-points"]
    assert main([*argv, "--json", str(folder / "q.json")]) == 0
    assert json.loads((q / llm.CONFIG_FILE).read_text())["quantization"]["bits"] == 4
    record = json.loads((folder / "q.json").read_text())
    assert record["result"]["mode"] == "int4" and record["result"]["layers"]
    out = folder / "v.json"
    argv = ["verify", str(f), str(q), "--data", str(text), "--window", "32", "--stride", "16"]
    assert main([*argv, "--prompts", "2", "--steps", "4", "--json", str(out)]) == 0
    result = json.loads(out.read_text())["result"]
    assert set(result["perplexity"]) == {"reference", "candidate"}
    assert 0 <= result["top1_agreement"] <= 1
    assert "top-1 agreement" in capsys.readouterr().out


def test_bad_input_is_one_line(folder, capsys):
    f = folder / "f"
    assert main(["quantize", str(f), "-o", str(folder / "x"), "--data", "/no/such.txt"]) == 1
    assert main(["verify", str(f), str(f)]) == 1  # no --data
    err = capsys.readouterr().err
    assert "error: /no/such.txt: no such file" in err and "--data" in err
    assert "Traceback" not in err
    for flag, value in (("--stages", "0"), ("--int8-layers", "-1")):
        argv = ["quantize", str(f), "-o", str(folder / "x"), "--mode", "int4", flag, value]
        assert main(argv) == 1
        assert f"error: {flag} must be at least" in capsys.readouterr().err
    # an ONNX file with an LLM mode is refused with the flags to use instead
    assert (
        main(["quantize", str(f / llm.MODEL_FILE), "-o", str(folder / "y.onnx"), "--mode", "int4"])
        == 1
    )
    assert "--mode weight-only --bits 4" in capsys.readouterr().err
