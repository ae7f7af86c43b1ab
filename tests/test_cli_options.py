"""The shared pieces of the command line (``cli.options``, ``cli._common``): what the commands
pass on to the library, how a duration, a note and a default are said, and a result refused (as a
user meets it: tests/compress/test_cli.py, tests/compress/train/test_budget_check.py)."""

from __future__ import annotations

import argparse
import io

import pytest
from rich.console import Console

from modelpress.cli import options
from modelpress.cli._common import print_notes, refuse_unless_kept
from modelpress.cli.main import build_parser
from modelpress.errors import OptionError, VerificationError


def _parsed(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("90", 90.0),
        ("90s", 90.0),
        ("10m", 600.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        (" 2 m ", 120.0),
    ],
)
def test_durations(text, seconds):
    assert options.parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text, phrase",
    [
        ("ten minutes", "write a duration"),
        ("10x", "write a duration"),
        ("10m5", "write a duration"),
        ("0", "must be more than 0"),
        ("0m", "must be more than 0"),
    ],
)
def test_bad_durations_name_the_option(text, phrase):
    with pytest.raises(OptionError, match=f"--time-budget {text}: {phrase}"):
        options.parse_duration(text)


def test_keywords_pass_the_options_on_as_given():
    args = _parsed(["prune", "m.onnx", "-o", "p.onnx", "--ratio", "0.25", "--rounds", "3"])
    assert options.keywords(args, "ratio", "rounds", "pattern") == {
        "ratio": 0.25,
        "rounds": 3,
        "pattern": "unstructured",
    }
    with pytest.raises(AttributeError):  # a name the parser does not have is the code's mistake
        options.keywords(args, "no_such_option")


def test_placement_is_the_device_group():
    args = _parsed(["run", "m.onnx", "d.npz", "-o", "o.npz", "--place", "Conv=cpu", "--strict"])
    assert options.placement(args) == {
        "backend": "ort",
        "device": "auto",
        "place": ["Conv=cpu"],
        "strict": True,
    }


@pytest.mark.parametrize("command", ["auto", "deploy"])
def test_search_args_are_one_mapping_for_auto_and_deploy(command):
    extra = ["--qps", "10", "--p99-ms", "50"] if command == "deploy" else []
    args = _parsed(
        [command, "m.onnx", "-o", "out", "--data", "v.npz", "--labels-key", "y", "--no-train"]
        + ["--time-budget", "1h30m", "--max-accuracy-drop", "0.02", *extra]
    )
    assert options.search_args(args) == {
        "data": "v.npz",
        "labels_key": "y",
        "max_accuracy_drop": 0.02,
        "time_budget_s": 5400.0,
        "train": False,
    }


def test_a_default_and_its_note_are_said_from_the_value():
    p = argparse.ArgumentParser()
    port = options.add_with_default(
        p, "--port", type=int, default=8000, help="port", note="0: any free port"
    )
    rate = options.add_with_default(p, "--rate", type=float, default=0.50, help="rate")
    assert port.help == "port (default 8000; 0: any free port)"
    assert rate.help == "rate (default 0.5)"
    assert p.parse_args([]).port == 8000


def test_a_switch_is_off_unless_given():
    p = argparse.ArgumentParser()
    options.add_switch(p, "--no-check", "skip the check")
    assert p.parse_args([]).no_check is False
    assert p.parse_args(["--no-check"]).no_check is True


def test_notes_are_text_not_markup():
    out = io.StringIO()
    to = Console(file=out, width=200, highlight=False)
    print_notes(["kept [conv1] and [bold]x[/bold] in float", "second"], to=to)
    assert out.getvalue().splitlines() == [
        "note: kept [conv1] and [bold]x[/bold] in float",
        "note: second",
    ]


class _Recorder:
    def __init__(self):
        self.written = []

    def write(self, data, **cards):
        self.written.append((data, cards))


def test_a_failed_result_is_refused_with_its_record(tmp_path):
    out = tmp_path / "q.onnx"
    args = argparse.Namespace(output=str(out), keep_anyway=False)
    recorder = _Recorder()
    with pytest.raises(VerificationError) as err:
        refuse_unless_kept(args, ["larger", "slower"], {"mode": "static"}, recorder, models={})
    assert str(err.value) == (
        f"{out} not written: larger; slower (--keep-anyway writes it regardless)"
    )
    assert recorder.written == [({"mode": "static", "written": None}, {"models": {}})]
    assert not out.exists()


def test_keep_anyway_or_no_failure_lets_the_result_through(tmp_path):
    recorder = _Recorder()
    kept = argparse.Namespace(output=str(tmp_path / "q.onnx"), keep_anyway=True)
    refuse_unless_kept(kept, ["larger"], {}, recorder)
    refuse_unless_kept(argparse.Namespace(output="x", keep_anyway=False), [], {}, recorder)
    assert recorder.written == []
