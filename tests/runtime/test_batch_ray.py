"""`run --ray`: the same answers from Ray Data (a local cluster the test starts, 2 CPUs) as from
the local loop; resuming from the same journal; a one-line message when ray is missing."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from pipeline_testing import image_folder, image_model, text_model, tokenizer_path

from modelpress.cli.main import main
from modelpress.errors import MissingExtraError
from modelpress.ir import save
from modelpress.runtime.batch import run_batch
from modelpress.runtime.batch.journal import journal_path
from modelpress.runtime.processing import Processing


@pytest.fixture(scope="module")
def cluster():
    import ray  # the ray extra is part of the test install (Makefile)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_images_on_ray_equal_the_local_run(tmp_path, cluster, capsys):
    image_folder(tmp_path / "images", 17, seed=3)
    (tmp_path / "images" / "bad.png").write_bytes(b"nope")
    model = image_model()
    Processing.declare(
        model, pre="image:resize=9,crop=8,mean=0.5,std=0.2", post="softmax,topk=2"
    ).store(model)
    path = save(model, tmp_path / "m.onnx")
    run_batch(path, tmp_path / "images", output=tmp_path / "local.jsonl", batch_size=4, workers=0)
    code = main(
        [
            "run",
            str(path),
            str(tmp_path / "images"),
            "-o",
            str(tmp_path / "ray.jsonl"),
            "--ray",
            "--batch-size",
            "4",
            "--quiet",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    # (words, not lines: a terminal narrower than the line wraps it where it likes)
    assert "18 item(s), 1 unreadable" in " ".join(captured.out.split())
    got, want = _lines(tmp_path / "ray.jsonl"), _lines(tmp_path / "local.jsonl")
    assert [g["id"] for g in got] == [w["id"] for w in want] and len(got) == 18
    for g, w in zip(got, want):
        if "error" in w:
            assert g == w
            continue
        assert [c["index"] for c in g["classes"]] == [c["index"] for c in w["classes"]]
        np.testing.assert_allclose(
            [c["score"] for c in g["classes"]], [c["score"] for c in w["classes"]], rtol=1e-5
        )
    assert not journal_path(tmp_path / "ray.jsonl").exists()


def test_texts_on_ray_resume_from_a_stopped_run(tmp_path, cluster):
    model, _, _ = text_model()
    Processing.declare(model, pre=f"text:tokenizer={tokenizer_path()},max_length=16").store(model)
    path = save(model, tmp_path / "t.onnx")
    texts = [f"sentence number {i} " + "word " * (i % 7) for i in range(11)]
    data = tmp_path / "texts.jsonl"
    data.write_text("".join(json.dumps(t) + "\n" for t in texts))
    run_batch(path, data, output=tmp_path / "local.jsonl", batch_size=3, workers=0)
    # stop a run after its first batch: the journal keeps items 0-2
    out = tmp_path / "ray.jsonl"

    class Stop(Exception):
        pass

    def stop(done, total):
        if done >= 3:
            raise Stop

    with pytest.raises(Stop):
        run_batch(path, data, output=out, batch_size=3, workers=0, progress=stop)
    result = run_batch(path, data, output=out, batch_size=3, ray=True, ray_actors=1)
    assert (result.resumed, result.written) == (3, 8)
    got, want = _lines(out), _lines(tmp_path / "local.jsonl")
    assert [g["id"] for g in got] == [w["id"] for w in want]
    np.testing.assert_allclose(
        [g["embedding"] for g in got], [w["embedding"] for w in want], rtol=1e-5, atol=1e-6
    )


def test_as_many_actors_as_cpus_share_them_instead_of_waiting_forever(tmp_path, cluster):
    import threading

    image_folder(tmp_path / "images", 6, seed=4)
    model = image_model()
    Processing.declare(model, pre="image:crop=8").store(model)
    path = save(model, tmp_path / "m.onnx")
    run_batch(path, tmp_path / "images", output=tmp_path / "local.jsonl", batch_size=2, workers=0)
    outcome = {}

    def run():
        outcome["result"] = run_batch(
            path, tmp_path / "images", output=tmp_path / "ray.jsonl", batch_size=2, ray=True,
            ray_actors=2,
        )  # fmt: skip

    # before: two actors held both CPUs of the cluster, the pre-processing never started, and the
    # run waited forever with no output
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=240)
    assert not worker.is_alive(), "run --ray-actors 2 on a 2-CPU cluster did not finish"
    assert outcome["result"].written == 6
    got, want = _lines(tmp_path / "ray.jsonl"), _lines(tmp_path / "local.jsonl")
    assert [g["id"] for g in got] == [w["id"] for w in want]


def test_cpu_shares_always_leave_room_for_pre_processing():
    from modelpress.runtime.batch.ray_data import cpu_shares

    assert cpu_shares(8, 2) == (1.0, 1.0)  # room enough: one CPU each
    for cpus, actors in [(2, 2), (2, 3), (1, 1), (4, 8), (16, 16)]:
        actor, task = cpu_shares(cpus, actors)
        assert 0 < task <= 1 and actors * actor + task <= cpus, (cpus, actors)


def test_missing_ray_names_the_extra(tmp_path, monkeypatch):
    image_folder(tmp_path / "images", 2)
    model = image_model()
    Processing.declare(model, pre="image:crop=8").store(model)
    path = save(model, tmp_path / "m.onnx")
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(
        MissingExtraError,
        match=r"--ray .* needs the 'ray' package: install it with `pip install 'modelpress\[ray\]'`",
    ):
        run_batch(path, tmp_path / "images", output=tmp_path / "p.jsonl", ray=True)
