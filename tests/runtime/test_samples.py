"""runtime.samples: one reader for calibration, training, batch inference and search."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from modelpress.errors import InputError
from modelpress.ir import parse
from modelpress.runtime.processing import Processing
from modelpress.runtime.samples import ImagePreprocess, open_samples, read_jsonl

GRAY = parse("""<ir_version: 8, opset_import: ["" : 17]> g (float[N, 1, 8, 8] img) => (float[N, 1] y) {
    p = GlobalAveragePool(img)
    y = Flatten(p)
}""")
MLP = parse("""<ir_version: 8, opset_import: ["" : 17]> g (float[N, 4] x) => (float[N, 4] y) {
    y = Relu(x)
}""")


def test_npz_dict_and_iterables_read_alike(tmp_path, rng):
    x = rng.standard_normal((10, 4)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(10))
    for source in (tmp_path / "d.npz", {"x": x, "y": np.arange(10)}):
        batches = list(open_samples(source, batch_size=4, labels_key="y").batches(MLP))
        assert [len(b.labels) for b in batches] == [4, 4, 2]
        np.testing.assert_array_equal(np.concatenate([b.feeds["x"] for b in batches]), x)
        (whole,) = open_samples(source, batch_size=None, labels_key="y").batches(MLP)
        np.testing.assert_array_equal(whole.labels, np.arange(10))
    pairs = [({"x": x[:3]}, np.arange(3)), {"x": x[3:], "y": np.arange(3, 10)}]
    got = list(open_samples(pairs, labels_key="y").batches(MLP))
    assert [b.labels.tolist() for b in got] == [[0, 1, 2], list(range(3, 10))]
    with pytest.raises(InputError, match="no array named 'z'"):
        list(open_samples(tmp_path / "d.npz", labels_key="z").batches(MLP))


def test_image_folder_with_classes_uses_the_declared_pre_processing(tmp_path, rng):
    files = []
    for cls in ("cat", "dog"):
        (tmp_path / cls).mkdir()
        for i in range(2):
            f = tmp_path / cls / f"{i}.png"
            Image.fromarray(rng.integers(0, 255, (11, 9), dtype=np.uint8), mode="L").save(f)
            files.append(f)
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    samples = open_samples(tmp_path, batch_size=3, pre="image:resize=8,crop=8")
    assert samples.classes == ["cat", "dog"] and samples.total == 2
    batches = list(samples.batches(GRAY))
    assert [b.labels.tolist() for b in batches] == [[0, 0, 1], [1]]
    want = Processing.declare(GRAY, pre="image:resize=8,crop=8").preprocess(
        [f.read_bytes() for f in files]
    )["img"]
    np.testing.assert_array_equal(np.concatenate([b.feeds["img"] for b in batches]), want)
    # the keyword form declares the same steps
    kw = ImagePreprocess(size=(8, 8), mode="L")
    (one,) = open_samples(tmp_path, batch_size=None, pre=kw).batches(GRAY)
    exact = Processing.declare(GRAY, pre="image:resize=8x8").preprocess(
        [f.read_bytes() for f in files]
    )["img"]
    np.testing.assert_allclose(one.feeds["img"], exact, rtol=0, atol=1e-7)


def test_jsonl_texts_labels_and_bad_lines(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"text": "a", "y": 1}\n\n{"text": "b", "id": "x", "y": 0}\n')
    ids, texts, labels, _ = read_jsonl(f, "y")
    assert (ids, texts, labels) == (["1", "x"], ["a", "b"], [1, 0])
    f.write_text('"a"\n{"text": "b"}\n')
    with pytest.raises(InputError, match=r"t.jsonl:1: expected an object"):
        read_jsonl(f, "y")
    f.write_text('"a"\nnot json\n')
    with pytest.raises(InputError, match=r"t.jsonl:2: not a JSON value"):
        read_jsonl(f)


def test_empty_and_unknown_sources(tmp_path):
    with pytest.raises(InputError, match="empty"):
        open_samples(tmp_path)
    (tmp_path / "m.txt").write_text("x")
    with pytest.raises(InputError, match="expected an .npz file"):
        open_samples(tmp_path / "m.txt")
    with pytest.raises(InputError, match="no such file"):
        open_samples(tmp_path / "missing.npz")
