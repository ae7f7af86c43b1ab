"""`modelpress pipeline`: declarations from the command line and from JSON/YAML files, stored in
the model and read back; bad ones refused with one line and nothing written."""

from __future__ import annotations

import json

import pytest
from pipeline_testing import image_model

from modelpress.cli.main import main
from modelpress.ir import load, save
from modelpress.runtime.processing import Processing


@pytest.fixture
def model_path(tmp_path):
    return save(image_model(), tmp_path / "m.onnx")


def test_command_line_declaration_is_stored_in_place(tmp_path, model_path, capsys):
    (tmp_path / "labels.txt").write_text("a\nb\nc\nd\n")
    code = main([
        "pipeline", str(model_path), "-o", str(model_path), "--json", str(tmp_path / "rec.json"),
        "--pre", "image:resize=10,crop=8,mean=0.485,0.456,0.406,std=0.229,0.224,0.225",
        "--post", f"softmax,topk=2,labels={tmp_path / 'labels.txt'}",
    ])  # fmt: skip
    assert code == 0
    proc = Processing.from_model(load(model_path))
    assert proc.pre.mean == (0.485, 0.456, 0.406) and proc.post.labels == ("a", "b", "c", "d")
    record = json.loads((tmp_path / "rec.json").read_text())
    assert record["command"] == "pipeline" and record["result"]["processing"] == proc.to_dict()
    capsys.readouterr()
    assert main(["pipeline", str(model_path)]) == 0  # shows what is declared
    shown = capsys.readouterr().out
    assert "pre: image:" in shown and "topk=2" in shown
    assert main(["pipeline", str(model_path), "-o", str(tmp_path / "plain.onnx"), "--remove"]) == 0
    assert Processing.from_model(load(tmp_path / "plain.onnx")) is None


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_spec_file_with_paths_relative_to_it(tmp_path, model_path, suffix):
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    (spec_dir / "labels.txt").write_text("w\nx\ny\nz\n")
    spec = {
        "pre": {"kind": "image", "resize": [9, 9], "crop": 8, "mean": [0.5], "std": [0.5]},
        "post": {"topk": 1, "labels": "labels.txt"},
    }
    if suffix == ".json":
        (spec_dir / "p.json").write_text(json.dumps(spec))
    else:
        import yaml

        (spec_dir / "p.yaml").write_text(yaml.safe_dump(spec))
    out = tmp_path / "out.onnx"
    # --post on the command line overrides the file's
    assert (
        main(["pipeline", str(model_path), "-o", str(out), "--spec", str(spec_dir / f"p{suffix}")])
        == 0
    )
    proc = Processing.from_model(load(out))
    assert (
        proc.pre.resize == (9, 9)
        and proc.post.labels == ("w", "x", "y", "z")
        and proc.post.topk == 1
    )
    assert (
        main(
            [
                "pipeline",
                str(model_path),
                "-o",
                str(out),
                "--spec",
                str(spec_dir / f"p{suffix}"),
                "--post",
                "argmax",
            ]
        )
        == 0
    )
    assert Processing.from_model(load(out)).post.labels is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pre", "image:crop=8,mean=1,2"], "error: pre.mean: 2 values given"),
        (
            ["--pre", "image:crop=8", "--post", "labels=nowhere.txt"],
            "error: post.labels: nowhere.txt: no such file",
        ),
        (["--pre", "image:crop=8,colour=rgb"], "error: pre.colour: unknown key"),
        (["--post", "topk=9"], "error: post.topk: 9 asked"),
        (["--spec", "missing.json"], "error: --spec missing.json: no such file"),
    ],
)
def test_bad_declarations_one_line_and_nothing_written(
    tmp_path, model_path, capsys, args, message, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    before = model_path.read_bytes()
    out = tmp_path / "out.onnx"
    assert main(["pipeline", str(model_path), "-o", str(out), *args]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(message) and "\n" not in err
    assert not out.exists() and model_path.read_bytes() == before


def test_bad_spec_files(tmp_path, model_path, capsys):
    (tmp_path / "bad.json").write_text("{oops")
    (tmp_path / "extra.json").write_text(json.dumps({"pre": "image:crop=8", "postprocess": {}}))
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    for name, message in (
        ("bad.json", "not valid JSON"),
        ("extra.json", "spec.postprocess: unknown key"),
        ("list.yaml", "expected a mapping"),
    ):
        assert (
            main(
                [
                    "pipeline",
                    str(model_path),
                    "-o",
                    str(tmp_path / "o.onnx"),
                    "--spec",
                    str(tmp_path / name),
                ]
            )
            == 1
        )
        assert message in capsys.readouterr().err
