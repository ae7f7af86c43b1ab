"""Recipes: a round trip through ``auto`` and ``recipe run`` gives the same model, bit for bit;
malformed recipes are refused with one line naming the file, the line and the field."""

from __future__ import annotations

import numpy as np
import pytest
from quant_models import image_like, small_cnn

from modelpress.cli.main import main
from modelpress.ir import model_bytes, save
from modelpress.ir.files import write_npz
from modelpress.search import RecipeError, load_recipe, parse_recipe, run_recipe


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("recipe")
    save(small_cnn(), folder / "cnn.onnx")
    write_npz(folder / "val.npz", {"x": image_like(np.random.default_rng(5), (48, 4, 8, 8))})
    return folder


def test_a_recipe_from_auto_replays_to_the_same_model_bit_for_bit(files, tmp_path, capsys):
    out = tmp_path / "best.onnx"
    code = main(
        [
            "auto",
            str(files / "cnn.onnx"),
            "-o",
            str(out),
            "--data",
            str(files / "val.npz"),
            "--max-accuracy-drop",
            "0.02",
            "--levels",
            "2",
            "--modes",
            "static",
            "--methods",
            "minmax",
            "--timing",
            "0.05",
            "--cache",
            str(tmp_path / "cache"),
        ]
    )
    assert code == 0
    recipe = load_recipe(tmp_path / "best.recipe.yaml")
    assert [next(iter(s)) for s in recipe.steps] == ["optimize", "quantize"]
    # paths are written relative to the recipe, so the recipe moves with its files
    assert not recipe.model.startswith("/") and recipe.output == "best.onnx"
    replay = tmp_path / "replay.onnx"
    assert main(["recipe", "run", str(tmp_path / "best.recipe.yaml"), "-o", str(replay)]) == 0
    assert replay.read_bytes() == out.read_bytes()
    capsys.readouterr()


def test_a_written_recipe_runs_with_a_bench_step(files, tmp_path):
    text = f"""
recipe: 1
model: {files / "cnn.onnx"}
steps:
  - optimize: {{level: 1}}
  - quantize:
      mode: dynamic
  - bench: {{batch_size: 2, seconds: 0.1}}
"""
    recipe = parse_recipe(text, name="r.yaml")
    result = run_recipe(recipe)
    kinds = [next(iter(s)) for s in result.steps]
    assert kinds == ["optimize", "quantize", "bench"]
    bench = result.steps[2]["bench"]
    assert bench["batch_size"] == 2 and bench["result"]["runs"] >= 5 and bench["ratio"] > 0
    assert result.source is not None and model_bytes(result.model) != model_bytes(result.source)


BAD = [
    (
        "steps:\n  - optimize: {level: 2}\n  - quantize:\n      mode: statik\n",
        "r.yaml:4: steps[1].quantize.mode: 'statik' is not one of static",
    ),
    (
        "model: m.onnx\nsteps:\n  - optimise: {level: 2}\n",
        "r.yaml:3: steps[0].optimise: unknown step 'optimise'; steps: convert, optimize, quantize",
    ),
    (
        "steps:\n  - optimize:\n      level: two\n",
        "r.yaml:3: steps[0].optimize.level: expected int, got str 'two'",
    ),
    (
        "steps:\n  - optimize:\n      level: 2\n      speed: max\n",
        "r.yaml:4: steps[0].optimize.speed: unknown option of optimize; options: level, passes",
    ),
    (
        "steps:\n  - optimize:\n      passes: [dead-code, warp-drive]\n",
        "r.yaml:3: steps[0].optimize.passes[1]: 'warp-drive' is not one of",
    ),
    (
        "steps:\n  - bench: {}\n  - optimize: {}\n",
        "r.yaml:2: steps[0].bench: bench measures the result: it can only be the last step",
    ),
    (
        "model: m.onnx\nstep:\n  - optimize: {}\n",
        "r.yaml:2: step: unknown field; fields: recipe, model",
    ),
    (
        "recipe: 3\nsteps:\n  - optimize: {}\n",
        "r.yaml:1: recipe: recipe format 3: this modelpress reads format 1",
    ),
    ("steps: []\n", "r.yaml:1: steps: expected a list of steps"),
    (
        "steps:\n  - optimize: {level: 2}\n    quantize: {}\n",
        "r.yaml:2: steps[0]: a step is a mapping with one key",
    ),
    ("steps:\n  - optimize: [1, 2\n", "r.yaml:3: not valid YAML"),
    ("- just\n- a list\n", "r.yaml:1: a recipe is a mapping with `steps:`"),
    ("model: 3\nsteps:\n  - optimize: {}\n", "r.yaml:1: model: expected a file path, got 3"),
    (
        "steps:\n  - quantize:\n      per_channel: 1\n",
        "r.yaml:3: steps[0].quantize.per_channel: expected bool, got int 1",
    ),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_a_malformed_recipe_is_one_line_naming_the_line_and_field(text, message):
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, name="r.yaml")
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_the_cli_reports_a_bad_recipe_in_one_line_and_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "r.yaml"
    bad.write_text(BAD[0][0])
    code = main(["recipe", "run", str(bad), "-o", str(tmp_path / "out.onnx")])
    err = capsys.readouterr().err.strip()
    assert (
        code == 1
        and err.startswith("error: " + str(bad) + BAD[0][1][len("r.yaml") :])
        and "\n" not in err
    )
    assert not (tmp_path / "out.onnx").exists()
    assert (
        main(["recipe", "run", str(tmp_path / "missing.yaml"), "-o", str(tmp_path / "o.onnx")]) == 1
    )
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'missing.yaml'}: no such file"
    (tmp_path / "nomodel.yaml").write_text("steps:\n  - optimize: {}\n")
    assert (
        main(["recipe", "run", str(tmp_path / "nomodel.yaml"), "-o", str(tmp_path / "o.onnx")]) == 1
    )
    assert "no `model:` to start from" in capsys.readouterr().err
