"""`run` over folders of images, .jsonl texts and .npz arrays, with worker processes: every
answer equal to ONNX Runtime on the same pre-processed inputs; the user's files never overwritten."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
from pipeline_testing import image_folder, image_model, text_model, tokenizer_path

from modelpress.cli.main import main
from modelpress.errors import OptionError
from modelpress.ir import model_bytes, save
from modelpress.runtime.batch import run_batch
from modelpress.runtime.processing import Processing

PRE = "image:resize=10,crop=8,mean=0.485,0.456,0.406,std=0.229,0.224,0.225"


def declared(model, tmp_path, name="m.onnx", **kw):
    Processing.declare(model, **kw).store(model)
    return save(model, tmp_path / name)


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    files = image_folder(root, 23)
    (root / "part1" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    (root / "notes.txt").write_text("not an image, not listed")
    return root, files


def reference_answers(model, proc, files):
    """ONNX Runtime on the whole set pre-processed at once, post-processed."""
    sess = ort.InferenceSession(model_bytes(model))
    feeds = proc.preprocess([f.read_bytes() for f in files])
    return proc.postprocess(dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds))))


@pytest.mark.parametrize("workers", [0, 2])
def test_folder_of_images_equals_onnx_runtime(tmp_path, images, workers):
    root, files = images
    model = image_model()
    path = declared(model, tmp_path, pre=PRE, post="softmax,topk=3")
    seen = []
    result = run_batch(
        path,
        root,
        output=tmp_path / "p.jsonl",
        batch_size=4,
        workers=workers,
        progress=lambda d, t: seen.append((d, t)),
    )
    lines = read_lines(tmp_path / "p.jsonl")
    ids = sorted([f.relative_to(root).as_posix() for f in files] + ["part1/broken.png"])
    assert [line["id"] for line in lines] == ids  # sorted by path, each once
    by_id = {line["id"]: line for line in lines}
    assert by_id["part1/broken.png"]["error"].startswith("part1/broken.png: not a readable image")
    want = reference_answers(model, Processing.from_model(model), files)
    for f, answer in zip(files, want):
        got = by_id[f.relative_to(root).as_posix()]["classes"]
        assert [c["index"] for c in got] == [c["index"] for c in answer["classes"]]
        np.testing.assert_allclose(
            [c["score"] for c in got], [c["score"] for c in answer["classes"]], rtol=1e-5
        )
    assert (result.items, result.written, result.errors, result.batch_size, result.workers) == (
        24,
        24,
        1,
        4,
        workers,
    )
    assert (
        seen[0] == (0, 24)
        and seen[-1] == (24, 24)
        and [d for d, _ in seen] == sorted(d for d, _ in seen)
    )
    assert result.busy_s > 0 and result.busy_s + result.wait_s <= result.elapsed_s
    assert not (tmp_path / "p.jsonl.mp-journal").exists()


def test_jsonl_texts_equal_onnx_runtime(tmp_path):
    model, _, _ = text_model()
    path = declared(model, tmp_path, pre=f"text:tokenizer={tokenizer_path()},max_length=24")
    texts = [
        "a short one",
        "The cat sat on the mat, and then it sat somewhere else entirely.",
        "ünïcode ✓",
        "",
    ]
    data = tmp_path / "texts.jsonl"
    data.write_text(
        "\n".join(
            [
                json.dumps(texts[0]),
                json.dumps({"id": "b", "text": texts[1]}),
                "",
                json.dumps(texts[2]),
                json.dumps(texts[3]),
            ]
        )
        + "\n"
    )
    assert (
        main(
            [
                "run",
                str(path),
                str(data),
                "-o",
                str(tmp_path / "e.jsonl"),
                "--batch-size",
                "3",
                "--workers",
                "1",
                "--quiet",
            ]
        )
        == 0
    )
    lines = read_lines(tmp_path / "e.jsonl")
    assert [line["id"] for line in lines] == ["1", "b", "4", "5"]  # line numbers unless given
    proc = Processing.from_model(model)
    want = ort.InferenceSession(model_bytes(model)).run(None, proc.preprocess(texts))[0]
    np.testing.assert_allclose([line["embedding"] for line in lines], want, rtol=1e-5, atol=1e-6)
    data.write_text('{"text": 3}\n')
    assert main(["run", str(path), str(data), "-o", str(tmp_path / "bad.jsonl")]) == 1


def test_npz_in_npz_out_and_jsonl_out(tmp_path, capsys):
    model = image_model(size=4)
    path = save(model, tmp_path / "plain.onnx")
    x = np.random.default_rng(0).standard_normal((5, 3, 4, 4)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    want = ort.InferenceSession(model_bytes(model)).run(None, {"x": x})[0]
    assert (
        main(
            [
                "run",
                str(path),
                "--inputs",
                str(tmp_path / "in.npz"),
                "-o",
                str(tmp_path / "o.npz"),
                "--batch-size",
                "2",
            ]
        )
        == 0
    )
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["y"], want, rtol=1e-6)
    assert (
        main(
            [
                "run",
                str(path),
                str(tmp_path / "in.npz"),
                "-o",
                str(tmp_path / "o.jsonl"),
                "--batch-size",
                "2",
            ]
        )
        == 0
    )
    lines = read_lines(tmp_path / "o.jsonl")
    assert [line["id"] for line in lines] == ["0", "1", "2", "3", "4"]
    np.testing.assert_allclose([line["y"] for line in lines], want, rtol=1e-6)
    assert "items/s" in capsys.readouterr().out


def test_static_batch_of_one_runs_items_one_at_a_time(tmp_path, images):
    root, files = images
    model = image_model(batch=1)
    path = declared(model, tmp_path, pre=PRE, post="argmax")
    result = run_batch(path, root, output=tmp_path / "p.jsonl", batch_size=4, workers=0)
    assert result.batch_size == 1 and "fixes its batch size" in result.note
    lines = {line["id"]: line for line in read_lines(tmp_path / "p.jsonl")}
    want = reference_answers(image_model(), Processing.from_model(model), files)
    assert [lines[f.relative_to(root).as_posix()]["classes"][0]["index"] for f in files] == [
        a["classes"][0]["index"] for a in want
    ]


def test_never_overwrites_the_model_or_the_data(tmp_path, images, capsys):
    root, _ = images
    path = declared(image_model(), tmp_path, pre=PRE)
    x = tmp_path / "in.npz"
    np.savez(x, x=np.zeros((1, 3, 8, 8), np.float32))
    before = path.read_bytes(), x.read_bytes()
    for out, what in ((path, "is the model"), (x, "is the input data")):
        assert main(["run", str(path), str(x), "-o", str(out)]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: -o {out}: {what}") and "\n" not in err
    assert (path.read_bytes(), x.read_bytes()) == before
    with pytest.raises(OptionError, match="predictions of image items go to a .jsonl"):
        run_batch(path, root, output=tmp_path / "p.npz")
    with pytest.raises(OptionError, match=r"-o .*\.csv: write predictions to a .jsonl"):
        run_batch(path, root, output=tmp_path / "p.csv")
    assert (
        main(
            [
                "run",
                str(save(image_model(), tmp_path / "raw.onnx")),
                str(root),
                "-o",
                str(tmp_path / "p.jsonl"),
            ]
        )
        == 1
    )
    assert "raw data needs a model that declares its pre-processing" in capsys.readouterr().err
    # a run that fails before any item is done leaves nothing behind
    assert (
        main(
            [
                "run",
                str(path),
                str(root),
                "-o",
                str(tmp_path / "p.jsonl"),
                "--device",
                "tpu",
                "--strict",
            ]
        )
        == 1
    )
    assert "error:" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npz", "m.onnx", "raw.onnx"]
