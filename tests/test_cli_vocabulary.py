"""One vocabulary across commands: ``modelpress <cmd> --help`` uses the same option for the same idea.

Read from each command's parser (what ``--help`` prints), the rules are: the old names of an idea
are never visible (``--inputs``/``--calib`` are ``--data``, ``--input`` is ``--shape``, ``--model``
is the positional MODEL); ``--report``, where a command has it, is the HTML page (``--report
FILE.html``), never the record; every command that reads samples offers
``--data``; every command writes its record with ``--json FILE``; an option of a known idea has
that idea's one name; no option takes a variable number of values (it would swallow the model
path that follows it). Commands not yet moved to the shared option groups are listed in
``NOT_YET`` as strict xfails, so the day one is moved its entry must go.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict

import pytest

from modelpress.cli.main import build_parser

# Old spellings that must not be visible in any --help.
RETIRED = {
    "--inputs",
    "--calib",
    "--calib-limit",
    "--input",
    "--model",
    "--batch",  # --batch-size
    "--keep",  # --exclude
    "--ray-address",  # --ray ADDRESS
    "--ray-actors",  # --replicas
    "--out",  # -o/--output
}
# Commands that run a model on samples.
READS_SAMPLES = {"verify", "optimize", "bench", "quantize", "run"}
# dest -> the one option string an idea goes by.
IDEAS = {
    "data": "--data",
    "json": "--json",
    "output": "--output",
    "dim": "--dim",
    "shape": "--shape",
    "backend": "--backend",
    "device": "--device",
    "key_file": "--key-file",
    "ort_level": "--ort-level",
    "batch_size": "--batch-size",
    "exclude": "--exclude",
    "replicas": "--replicas",
}
# "(default X)" in a help text: X is what the option is when it is not given.
SAYS_DEFAULT = re.compile(r"(?:^|\(|; )default:? ([^);,:]+)")
# Commands whose parser has not moved to cli/options.py yet (owner in the reason).
NOT_YET = {}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its subparsers here and nowhere public
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _commands() -> dict[str, argparse.ArgumentParser]:
    """Every command, and a command's own actions as ``command action`` (``recipe run``)."""
    out = {}
    for name, parser in _subparsers(build_parser()).items():
        actions = _subparsers(parser)
        out.update({f"{name} {a}": p for a, p in actions.items()} if actions else {name: parser})
    return out


COMMANDS = _commands()


def _visible(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS]


def problems(name: str, parser: argparse.ArgumentParser) -> list[str]:
    """What in ``parser`` breaks the shared vocabulary (empty when nothing does)."""
    out = []
    visible = _visible(parser)
    flags = {o for a in visible for o in a.option_strings}
    out += [f"shows the retired {f}" for f in sorted(flags & RETIRED)]
    if name in READS_SAMPLES and "--data" not in flags:
        out.append("reads samples but has no --data")
    if "--json" not in flags:
        out.append("has no --json FILE")
    for a in visible:
        if "--report" in a.option_strings and (a.dest != "report" or a.metavar != "FILE.html"):
            out.append("--report is the HTML page (--report FILE.html), not the record (--json)")
        want = IDEAS.get(a.dest)
        if want and want not in a.option_strings:
            out.append(f"calls {a.dest!r} {'/'.join(a.option_strings)}, not {want}")
        if a.nargs in ("+", "*"):
            out.append(f"{'/'.join(a.option_strings)} takes nargs={a.nargs!r} (swallows MODEL)")
        if "--optimize" in a.option_strings and a.nargs != 0:
            out.append("--optimize takes a value; it only means: run modelpress's optimizer")
    return out


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=NOT_YET[n]))
        if n in NOT_YET
        else n
        for n in COMMANDS
    ],
)
def test_help_speaks_the_shared_vocabulary(name, capsys):
    parser = COMMANDS[name]
    assert problems(name, parser) == []
    # and --help itself prints those names (argparse builds it from the same actions)
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    text = capsys.readouterr().out
    assert "--json" in text and not any(f"{f} " in text or f"{f}," in text for f in RETIRED)


def test_the_check_finds_a_planted_violation():
    bad = argparse.ArgumentParser(prog="modelpress planted")
    bad.add_argument("model")
    bad.add_argument("--inputs")
    bad.add_argument("--vs", nargs="+")
    bad.add_argument("--optimize", choices=["all", "basic"])
    bad.add_argument("--out", dest="output")
    found = problems("run", bad)
    assert "shows the retired --inputs" in found
    assert "reads samples but has no --data" in found and "has no --json FILE" in found
    assert any("nargs='+'" in p for p in found) and any("--optimize" in p for p in found)
    assert any("not --output" in p for p in found)


@pytest.mark.parametrize("old, new", [("--inputs", "--data"), ("--calib", "--data")])
def test_old_sample_names_still_work_hidden(old, new, tmp_path):
    """The old names parse for one release, into the same place as the new one."""
    parser = build_parser()
    a = parser.parse_args(["verify", "a.onnx", "b.onnx", old, "x.npz"])
    b = parser.parse_args(["verify", "a.onnx", "b.onnx", new, "x.npz"])
    assert a.data == b.data == "x.npz"


def test_list_options_do_not_swallow_the_model():
    parser = build_parser()
    args = parser.parse_args(["bench", "--vs", "b.onnx", "a.onnx", "--vs", "c.onnx,d.onnx"])
    from modelpress.cli.options import listed

    assert args.model == "a.onnx" and listed(args.vs) == ["b.onnx", "c.onnx", "d.onnx"]
    args = parser.parse_args(["optimize", "--skip", "noop", "m.onnx", "-o", "o.onnx"])
    assert args.model == "m.onnx" and listed(args.skip) == ["noop"]
    args = parser.parse_args(["ops", "m.onnx"])
    assert args.model == "m.onnx"
    args = parser.parse_args(["convert", "m.pt", "-o", "m.onnx", "--input", "x=1x3"])
    assert args.shape == ["x=1x3"]  # the old name of --shape, hidden


def test_one_name_per_idea_across_commands():
    """Across every command, an option's flag always fills the same field, and a field always
    has the same flag: no flag names two ideas, no idea goes by two flags."""
    dests, flags = defaultdict(set), defaultdict(set)
    for parser in COMMANDS.values():
        for a in _visible(parser):
            longs = tuple(o for o in a.option_strings if o.startswith("--"))
            for flag in longs:
                dests[flag].add(a.dest)
            flags[a.dest].add(longs)
    assert {f: d for f, d in dests.items() if len(d) > 1} == {}
    assert {d: f for d, f in flags.items() if len(f) > 1} == {}


def _said_default(help_text: str | None) -> str | None:
    m = SAYS_DEFAULT.search(help_text or "")
    return m.group(1).strip() if m else None


def _same(said: str, value) -> bool:
    try:
        return float(said) == float(value)
    except (TypeError, ValueError):
        return said == str(value)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_help_shows_the_defaults_the_code_uses(name):
    """Where ``--help`` says "(default X)" of an option the parser fills in, X is that value
    (an option the command fills in itself has no parser default; its help explains it)."""
    parser = COMMANDS[name]
    wrong = []
    for a in _visible(parser):
        said, value = _said_default(a.help), parser.get_default(a.dest)
        if (
            said is not None
            and value not in (None, [], False, argparse.SUPPRESS)
            and not _same(said, value)
        ):
            wrong.append(f"{a.option_strings[-1]}: help says {said!r}, the code uses {value!r}")
    assert wrong == []


def test_distill_help_is_what_it_does():
    distill = COMMANDS["distill"]
    assert distill.get_default("epochs") == 10 and distill.get_default("temperature") == 4.0
    assert "--no-train" not in {o for a in _visible(distill) for o in a.option_strings}
    text = distill.format_help()
    assert "(default 10)" in text and "(default 4)" in text


@pytest.mark.parametrize(
    "argv, dest, value",
    [
        (["advise", "--batch", "8"], "batch_size", 8),
        (["prune", "m.onnx", "-o", "p.onnx", "--keep", "a,b"], "exclude", ["a,b"]),
        (["compress", "m.onnx", "-o", "c.mpz", "--data", "d.npz", "--keep", "a"], "exclude", ["a"]),
        (["run", "m.onnx", "--data", "d", "-o", "o.jsonl", "--ray-actors", "2"], "replicas", 2),
        (["serve", "m.onnx", "--ray-address", "ray://h:1"], "ray_address", "ray://h:1"),
        (["serve", "m.onnx", "--ray", "ray://h:1"], "ray", "ray://h:1"),
        (["demo", "--out", "d"], "output", "d"),
    ],
)
def test_old_spellings_still_parse_hidden(argv, dest, value):
    assert getattr(build_parser().parse_args(argv), dest) == value


def test_quantize_report_is_the_page_only(tmp_path, capsys):
    from modelpress.cli.main import main

    code = main(["quantize", "m.onnx", "-o", str(tmp_path / "q.onnx"), "--report", "r.json"])
    err = capsys.readouterr().err
    assert code == 1 and "--report r.json: the HTML page is FILE.html" in err
