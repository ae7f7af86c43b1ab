"""One vocabulary across commands: ``modelpress <cmd> --help`` uses the same option for the same idea.

Read from each command's parser (what ``--help`` prints), the rules are: the old names of an idea
are never visible (``--inputs``/``--calib`` are ``--data``, ``--input`` is ``--shape``, ``--model``
is the positional MODEL); ``--report``, where a command has it, is the HTML page (``--report
FILE.html``), never the record; every command that reads samples offers
``--data``; every command writes its record with ``--json FILE``; an option of a known idea has
that idea's one name; no option takes a variable number of values (it would swallow the model
path that follows it); every option is in ``GLOSSARY`` with the one idea it names, and no flag is
used for two ideas (values of another kind, choices that share nothing); every default the parser
fills in is said in the help. Commands not yet moved to the shared option groups are listed in
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
# Every option of every command, with the one idea it names. A new option is added here with its
# idea; a flag that would name a second idea gets a precise name of its own instead (the old
# spelling of a renamed flag stays a hidden alias: ``options.OLD_SPELLINGS``).
GLOSSARY = {
    "--act-order": "GPTQ's column order",
    "--activation-type": "the int8 type of activations",
    "--float-zero-points": "int4 blocks with each block's own float zero point",
    "--int8-layers": "how many LLM MatMuls most hurt by 4 bits stay at 8 bits",
    "--tune-steps": "steps tuning an int4 LLM's block scales against the float model",
    "--algorithm": "how LLM weights are rounded to int4/int8 (AWQ, GPTQ, RTN)",
    "--alpha": "weight of the teacher's soft loss when labels exist too",
    "--api-key-file": "the file holding the API key callers must send",
    "--atol": "absolute tolerance",
    "--avg-seq": "mean real sequence length for padding-free encoder inference",
    "--backend": "execution backend",
    "--batch-size": "samples per model run",
    "--batching": "whether items may be joined into batches",
    "--bits": "bits per weight",
    "--block-size": "weights per quantization scale",
    "--body-timeout": "seconds for a request's body to arrive",
    "--cache": "where trials are kept",
    "--calibrate": "measure this CPU against the advisor's model of it",
    "--catalog": "CSV or JSON file adding or overriding catalog entries",
    "--chat": "conversations, one JSON list of messages a line",
    "--check": "serve the plan here and measure it",
    "--check-seconds": "how long the check of a plan sends requests",
    "--chunk-size": "bytes per encrypted chunk",
    "--cpu-own-usd-hr": "cost of owning this machine per hour",
    "--cpu-usd-hr": "rent of this machine per hour",
    "--crop": "centre crop of image folders",
    "--data": "samples to run the model on (.npz, a folder, a text file for LLMs)",
    "--device": "where the model runs",
    "--dim": "size of a named dynamic dimension",
    "--drain-timeout": "on SIGTERM, how long to wait for accepted requests",
    "--dynamic": "keep this axis of an input dynamic",
    "--electricity": "owned hardware: USD per kWh",
    "--embeddings": "the embedding table and LM head",
    "--engine": "how GPUs run the model: compiled or eager",
    "--epochs": "passes over the training data",
    "--exclude": "nodes or layers left as they are",
    "--external-data": "store weights in OUT.data beside the model",
    "--feature-weight": "weight of the hidden-state / feature-map loss",
    "--force": "replace an existing file",
    "--gen-tokens": "tokens generated per request by decoder LLMs",
    "--global-ranking": "structured: rank the units of each kind across all groups",
    "--gguf-blocks": "keep a GGUF file's own quantized blocks",
    "--gpu": "GPUs of the advisor's catalog to consider",
    "--grayscale": "one channel of image folders",
    "--greedy-tokens": "greedy tokens per prompt",
    "--head-ratio": "structured: fraction of attention heads to remove",
    "--header-timeout": "seconds for a request's headers to arrive",
    "--host": "address to listen on",
    "--html": "the advisor's ranking page (HTML)",
    "--image": "the container image KServe runs",
    "--image-size": "resize of image folders",
    "--importance": "structured: what ranks channels, neurons and heads",
    "--input-sets": "number of generated input sets",
    "--json": "the command's record (JSON)",
    "--keep-anyway": "write the result even when its check fails",
    "--key-env": "an environment variable holding the key",
    "--key-file": "the key of a protected model",
    "--labels-key": "the array of labels in the --data .npz",
    "--latency-ms": "online inference latency target",
    "--layout": "layout of image folders",
    "--level": "the optimizer's level (0-3)",
    "--levels": "optimizer levels a search tries",
    "--life-years": "owned hardware: years to amortise the price over",
    "--limit": "use at most N samples of --data",
    "--list-gpus": "print the catalog and exit",
    "--log-placement": "print node → device and the copies between devices",
    "--lr": "learning rate",
    "--max-accuracy-drop": "the largest drop of the metric allowed",
    "--max-batch": "the most rows one model run takes",
    "--max-body-mb": "largest request body",
    "--max-connections": "open connections",
    "--max-context": "most tokens of prompt and answer",
    "--max-delay-ms": "how long a batch waits to fill",
    "--max-float-layers": "layers of a quantized candidate kept in float",
    "--max-pending-mb": "request bytes the server holds at once",
    "--max-queue": "requests that may wait per model",
    "--max-request-rows": "most rows one request may bring",
    "--max-seqs": "sequences generated at once",
    "--max-tokens": "tokens generated at most",
    "--mean": "per-channel mean of image folders",
    "--measured": "bench records to plan from instead of measuring",
    "--method": "calibration observer for static mode",
    "--methods": "static mode's calibration observers to try",
    "--metric": "what a search keeps: top1, cosine or mse",
    "--min-agreement": "class scores without labels: the least top-1 agreement with the original",
    "--min-cosine": "other outputs: the least mean cosine with the original's",
    "--mode": "the quantization mode",
    "--modes": "quantization modes a search tries",
    "--name": "the name a model is served under",
    "--no-bias-correction": "static: skip bias correction",
    "--no-chat-template": "give --prompt to the model as it is, not as a user message of the chat",
    "--no-check": "do not serve and measure the plan after writing",
    "--no-cpu": "do not measure the .onnx model on this machine's CPU",
    "--no-encrypt": "write the obfuscated graph as .onnx",
    "--no-features": "do not match hidden states",
    "--no-gptq": "static and weight-only: round weights to nearest instead of by GPTQ",
    "--no-latency": "skip the latency check",
    "--no-optimize": "do not run the optimizer",
    "--no-smooth": "dynamic, and static on transformers: do not move activation outliers",
    "--no-train": "compress without training",
    "--no-verify": "skip comparing the result with the original",
    "--nodes": "print a per-node table",
    "--num-gpus": "devices per candidate",
    "--obfuscate": "obfuscate the graph",
    "--obfuscation": "what the obfuscation covers: runtime or storage",
    "--ops": "which ops an LLM folder is written with: standard ONNX or ONNX Runtime's",
    "--opset": "ONNX opset to target",
    "--optimize": "run modelpress's optimizer on the result",
    "--optimizer": "the training optimizer",
    "--ort-level": "ONNX Runtime's own graph optimization level",
    "--output": "where the result goes",
    "--p99-ms": "99th-percentile latency target per request, ms",
    "--passes": "run exactly these passes",
    "--patience": "stop after N held-out evaluations without improvement",
    "--pattern": "unstructured or 2:4 sparsity",
    "--per-tensor": "one weight scale per tensor instead of per channel",
    "--place": "pin an op type or node-name glob to a device",
    "--port": "port to listen on",
    "--post": "post-processing stored with the model",
    "--power-cap-w": "edge scenario: only devices whose TDP is within this many watts",
    "--pre": "pre-processing stored with the model",
    "--precision": "compute precision",
    "--prefetch": "prepared batches kept ready",
    "--prefill-chunk": "prompt tokens run between two decode steps",
    "--profile-ops": "per-operator time from the runtime's profiler",
    "--prompt": "a prompt",
    "--prompts": "how many prompts top-1 agreement is measured on",
    "--protect": "protect the chosen model last",
    "--qps": "requests per second the service must handle",
    "--quiet": "print nothing but the result and errors",
    "--ratio": "fraction of each group's channels/neurons removed",
    "--ray": "run on Ray (the cluster at ADDRESS)",
    "--recipe": "where to write the winner's recipe",
    "--refit": "structured: refit the layers that read removed neurons and heads by",
    "--remove": "remove the model's declaration",
    "--rename-io": "rename the graph's inputs and outputs too",
    "--repetition-penalty": "divide the logits of tokens already seen by X",
    "--replicas": "model replicas on Ray",
    "--report": "the command's HTML page",
    "--restart": "start over instead of resuming a stopped run",
    "--round-to": "structured: keep a multiple of N channels per group",
    "--rounds": "pruning rounds, fine-tuned after each",
    "--rtol": "relative tolerance",
    "--runs": "timed runs per model",
    "--samples": "samples a job processes (its time and cost)",
    "--schedule": "learning-rate schedule after warm-up",
    "--scope": "one pruning threshold for all layers or per layer",
    "--seed": "the random seed",
    "--stages": "sequential calibration: runs of layers measured through those already quantized",
    "--split-seed": "the seed of the split of --data into training and validation parts",
    "--seq": "sequence length of a text model",
    "--shape": "the whole shape of an input",
    "--skip": "passes not to run",
    "--soft-loss": "loss against the teacher's outputs",
    "--sparsity": "fraction of weights set to zero",
    "--spec": "a JSON or YAML file with pre and/or post",
    "--std": "per-channel std of image folders",
    "--steps": "optimizer steps",
    "--stop": "stop when the text contains TEXT, left out of the output",
    "--strength": "obfuscation strength: the share of nodes that get decoys",
    "--strict": "fail instead of falling back to the CPU when a device is missing",
    "--stride": "tokens between windows",
    "--student": "the student model",
    "--symmetric": "int4 without zero points",
    "--target": "what a search times or estimates on: cpu or a GPU",
    "--target-cpu": "the CPU int8 formats are made for",
    "--task": "training or inference",
    "--temperature": "softmax temperature",
    "--text-tokens": "score only the text's first N tokens",
    "--threads": "intra-op threads",
    "--time-budget": "how long a search may start trials",
    "--timing": "seconds spent timing each candidate",
    "--title": "the page's title",
    "--top": "rows of the per-node table",
    "--top-k": "sample from the K most likely tokens",
    "--top-p": "sample from the most likely tokens up to mass P",
    "--train-data": "training samples for a search",
    "--validation-fraction": "the part of --data held out to score candidates",
    "--utilization": "owned hardware: fraction of the time busy",
    "--val-fraction": "samples held out for early stopping and the check",
    "--vs": "other models to time in the same runs",
    "--warmup": "untimed runs first",
    "--width": "make the student from the teacher: keep this fraction of its channels",
    "--window": "tokens per window (scored or calibrated)",
    "--workers": "pre-processing worker processes",
    "--workload": "a built-in workload",
}
# "(default X)" in a help text: X is what the option is when it is not given.
SAYS_DEFAULT = re.compile(r"(?:^|\(|; )default:? ([^);,:]+)")
# Commands whose parser has not moved to cli/options/ yet (owner in the reason).
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


def _flags() -> dict[str, list[tuple[str, argparse.Action]]]:
    """``{flag: [(command, action), ...]}`` of every visible long option."""
    out = defaultdict(list)
    for name, parser in COMMANDS.items():
        for a in _visible(parser):
            for flag in a.option_strings:
                if flag.startswith("--") and flag != "--help":
                    out[flag].append((name, a))
    return out


def collisions(uses: dict[str, list[tuple[str, argparse.Action]]]) -> list[str]:
    """Flags whose uses cannot be one idea: a different kind of value (int, float, text), or
    choices that share nothing (``--mode static`` and ``--mode runtime`` are two ideas)."""
    out = []
    for flag, where in sorted(uses.items()):
        kinds = {getattr(a.type, "__name__", str(a.type)) for _, a in where if a.nargs != 0}
        if len(kinds) > 1:
            out.append(f"{flag} takes {' and '.join(sorted(kinds))} values")
        choices = [(n, set(a.choices)) for n, a in where if a.choices]
        for i, (n1, c1) in enumerate(choices):
            for n2, c2 in choices[i + 1 :]:
                if not c1 & c2:
                    out.append(f"{flag}: {n1} {sorted(c1)} and {n2} {sorted(c2)} share no choice")
    return out


def test_every_option_is_in_the_glossary():
    """Every visible option of every command names one idea listed in ``GLOSSARY``, and the
    glossary lists nothing that no command offers."""
    uses = _flags()
    assert sorted(set(uses) - set(GLOSSARY)) == []
    assert sorted(set(GLOSSARY) - set(uses)) == []


def test_no_flag_names_two_ideas():
    assert collisions(_flags()) == []


def test_the_collision_check_finds_planted_ones():
    a, b = argparse.ArgumentParser(), argparse.ArgumentParser()
    mode_a = a.add_argument("--mode", choices=["static", "dynamic"])
    mode_b = b.add_argument("--mode", choices=["runtime", "storage"])
    runs_a = a.add_argument("--runs", type=int)
    runs_b = b.add_argument("--runs", type=float)
    found = collisions(
        {"--mode": [("x", mode_a), ("y", mode_b)], "--runs": [("x", runs_a), ("y", runs_b)]}
    )
    assert found == [
        "--mode: x ['dynamic', 'static'] and y ['runtime', 'storage'] share no choice",
        "--runs takes float and int values",
    ]


@pytest.mark.parametrize(
    "argv, dest, value",
    [
        (["verify", "a.onnx", "b.onnx", "--runs", "3"], "input_sets", 3),
        (["optimize", "a.onnx", "-o", "b.onnx", "--runs", "3"], "input_sets", 3),
        (["verify", "a", "b", "--steps", "4", "--max-tokens", "9"], "greedy_tokens", 4),
        (["verify", "a", "b", "--max-tokens", "9"], "text_tokens", 9),
        (["demo", "--rounds", "7"], "runs", 7),
        (["prune", "m.onnx", "-o", "p.onnx", "--ratio", "0.5", "--iterations", "3"], "rounds", 3),
        (["protect", "m.onnx", "-o", "m.mpk", "--obfuscate", "--ratio", "0.3"], "strength", 0.3),
        (
            ["protect", "m.onnx", "-o", "m.mpk", "--obfuscate", "--mode", "storage"],
            "obfuscation",
            "storage",
        ),
        (["convert", "llm", "-o", "out", "--level", "ort"], "ops", "ort"),
        (["quantize", "llm", "-o", "out", "--level", "standard"], "ops", "standard"),
        (["quantize", "llm", "-o", "out", "--seq-len", "64"], "window", 64),
    ],
)
def test_renamed_flags_still_parse_hidden(argv, dest, value):
    """The flags renamed so that one name means one idea: the old spelling parses, hidden."""
    assert getattr(build_parser().parse_args(argv), dest) == value


def test_every_old_spelling_is_hidden_and_fills_the_new_field():
    from modelpress.cli.options import OLD_SPELLINGS

    for command, renamed in OLD_SPELLINGS.items():
        parser = COMMANDS[command]
        for flag, olds in renamed.items():
            new = parser._option_string_actions[flag]
            assert new.help != argparse.SUPPRESS, (command, flag)
            for old in olds:
                action = parser._option_string_actions[old]
                assert action.help == argparse.SUPPRESS and action.dest == new.dest, (command, old)


def _said_default(help_text: str | None) -> str | None:
    m = SAYS_DEFAULT.search(help_text or "")
    return m.group(1).strip() if m else None


def _same(said: str, value) -> bool:
    if isinstance(value, (list, tuple)):
        return _same(said, ",".join(str(v) for v in value)) or (
            len(value) == 1 and _same(said, value[0])
        )
    try:
        return float(said) == float(value)
    except (TypeError, ValueError):
        return said.strip("'") == str(value)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_help_shows_the_defaults_the_code_uses(name):
    """Every option the parser fills in says so in ``--help`` as "(default X)", X being that
    value (an option the command fills in itself has no parser default; its help explains it)."""
    parser = COMMANDS[name]
    wrong = []
    for a in _visible(parser):
        said, value = _said_default(a.help), parser.get_default(a.dest)
        if value in (None, [], False, argparse.SUPPRESS) or a.nargs == 0:
            continue
        if said is None:
            wrong.append(f"{a.option_strings[-1]}: help does not say its default {value!r}")
        elif not _same(said, value):
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
