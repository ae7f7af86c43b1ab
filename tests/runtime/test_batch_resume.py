"""A run killed at any point (SIGKILL) and started again writes every item exactly once; the
output never appears half-written; the journal survives torn records and refuses other runs."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from pipeline_testing import image_folder, image_model

import modelpress
from modelpress.errors import InputError
from modelpress.ir import save
from modelpress.runtime.batch import run_batch
from modelpress.runtime.batch.journal import Journal, journal_path
from modelpress.runtime.processing import Processing

DRIVER = """
import sys
from modelpress.runtime.batch import run_batch

def progress(done, total):
    print(done, total, flush=True)

run_batch(sys.argv[1], sys.argv[2], output=sys.argv[3], batch_size=int(sys.argv[4]), workers=int(sys.argv[5]), progress=progress)
print("finished", flush=True)
"""


def _env():
    env = dict(os.environ)
    src = str(Path(modelpress.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    return env


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    image_folder(tmp / "images", 40, seed=5)
    model = image_model()
    Processing.declare(
        model, pre="image:resize=10,crop=8,mean=0.5,std=0.25", post="softmax,topk=2"
    ).store(model)
    path = save(model, tmp / "m.onnx")
    run_batch(path, tmp / "images", output=tmp / "reference.jsonl", batch_size=3, workers=0)
    (tmp / "driver.py").write_text(DRIVER)
    return tmp, path


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sigkill_at_random_points_then_restart_writes_each_item_once(setup):
    tmp, model = setup
    out = tmp / "predictions.jsonl"
    rng = random.Random(17)
    total = 40
    done_before = 0
    kills = 0
    for attempt in range(4):
        workers = 2 if attempt == 1 else 0  # one run with worker processes killed under it too
        cmd = [
            sys.executable,
            str(tmp / "driver.py"),
            str(model),
            str(tmp / "images"),
            str(out),
            "2",
            str(workers),
        ]
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
            start_new_session=True,
        )
        target = done_before + rng.randrange(
            0, max(1, (total - done_before) // 3)
        )  # several kills before the end
        finished = False
        for line in proc.stdout:
            if line.startswith("finished"):
                finished = True
                break
            if int(line.split()[0]) >= target:
                time.sleep(
                    rng.uniform(0, 0.01)
                )  # land inside inference, a journal write, or the final rename
                break
        if not finished:
            os.killpg(proc.pid, signal.SIGKILL)  # the run and its workers, as a crash would
            kills += 1
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
        journal = journal_path(out)
        if out.exists() and not journal.exists():  # it got to the end
            break
        assert not out.exists() or len(_lines(out)) == total  # never a partial output
        with Journal(out, _fingerprint_of(journal)) as j:  # what the next run will find
            assert len(j.done) >= done_before
            done_before = len(j.done)
    assert kills >= 3
    if not out.exists() or journal_path(out).exists():  # finish the job
        run_batch(model, tmp / "images", output=out, batch_size=2, workers=0)
    got, want = _lines(out), _lines(tmp / "reference.jsonl")
    assert [g["id"] for g in got] == [w["id"] for w in want]  # each item once, in order
    assert len({g["id"] for g in got}) == total
    for g, w in zip(got, want):
        assert [c["index"] for c in g["classes"]] == [c["index"] for c in w["classes"]]
        np.testing.assert_allclose(
            [c["score"] for c in g["classes"]], [c["score"] for c in w["classes"]], rtol=1e-5
        )
    assert not journal_path(out).exists()


def _fingerprint_of(journal: Path) -> str:
    from modelpress.runtime.batch.journal import scan

    records, _ = scan(journal.read_bytes())
    return records[0][1]["fingerprint"]


def test_torn_record_is_cut_and_its_items_run_again(tmp_path):
    out = tmp_path / "o.jsonl"
    with Journal(out, "fp") as j:
        j.append([0, 1], b'{"id": "a"}\n{"id": "b"}\n')
        j.append([2], b'{"id": "c"}\n')
    path = journal_path(out)
    whole = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(whole - 3)  # the last record torn by a kill
    with Journal(out, "fp") as j:
        assert j.done == {0, 1}
        assert path.stat().st_size < whole - 3  # cut back to the last whole record
        j.append([2], b'{"id": "c"}\n')
    blob = bytearray(path.read_bytes())
    blob[-2] ^= 0xFF  # a flipped byte fails the CRC
    path.write_bytes(bytes(blob))
    with Journal(out, "fp") as j:
        assert j.done == {0, 1}


def test_journal_of_another_run_is_refused_and_one_writer_at_a_time(tmp_path):
    out = tmp_path / "o.jsonl"
    with Journal(out, "first") as j:
        j.append([0], b"{}\n")
        with pytest.raises(InputError, match="another run is writing o.jsonl"):
            Journal(out, "first")
    with pytest.raises(
        InputError,
        match="left by a run with another model, data or output format; remove it, or pass `restart`",
    ):
        Journal(out, "second")
    with Journal(out, "second", restart=True) as j:
        assert j.done == set()


def test_crash_between_rename_and_journal_removal_writes_the_same_file(setup, tmp_path):
    tmp, model = setup
    out = tmp_path / "p.jsonl"
    run_batch(model, tmp / "images", output=out, batch_size=8, workers=0)
    first = out.read_bytes()
    # as if killed after the output's rename: a complete journal is still there
    from modelpress.runtime.batch import run as run_module

    orig = Journal.remove
    Journal.remove = Journal.close
    try:
        run_batch(model, tmp / "images", output=out, batch_size=8, workers=0, restart=True)
    finally:
        Journal.remove = orig
    assert journal_path(out).exists()
    result = run_batch(model, tmp / "images", output=out, batch_size=8, workers=0)
    assert result.resumed == 40 and result.written == 0
    assert out.read_bytes() == first and not journal_path(out).exists()
    del run_module


SLOW_DRIVER = """
import sys, time
from modelpress.runtime.batch import run_batch

def progress(done, total):
    print(done, total, flush=True)
    time.sleep(0.5)  # a slow consumer: the run is still going when it is killed

if __name__ == "__main__":  # workers import this file again
    run_batch(
        sys.argv[1], sys.argv[2], output=sys.argv[3], batch_size=1, workers=2, progress=progress
    )
"""


def _descendants(pid: int) -> set[int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_die_with_a_sigkilled_run(setup):
    tmp, model = setup
    (tmp / "slow.py").write_text(SLOW_DRIVER)
    proc = subprocess.Popen(
        [sys.executable, str(tmp / "slow.py"), str(model), str(tmp / "images")]
        + [str(tmp / "killed.jsonl")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_env(),
        start_new_session=True,
    )
    try:
        for line in proc.stdout:
            if int(line.split()[0]) >= 2:  # the workers are up and preparing
                break
        children = _descendants(proc.pid)
        assert children, "no worker processes found"
        os.kill(proc.pid, signal.SIGKILL)  # only the run: no clean-up code of it runs
        proc.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(p) for p in children):
            time.sleep(0.2)
        # before: 4 processes (the forkserver and its workers) lived on, 300 MB
        assert not [p for p in children if _alive(p)]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.stdout.close()
