"""Option groups that every command shares: one name for one idea.

| idea | option(s) |
| --- | --- |
| the model | positional ``MODEL`` (.onnx; .mpk with a key; .mpz) |
| where the result goes | ``-o/--output`` |
| the command's record | ``--json FILE`` |
| the command's page | ``--report FILE.html`` (model card and charts; ``modelpress report`` joins several) |
| samples to run the model on | ``--data PATH`` (+ ``--labels-key``, ``--batch-size``, ``--limit``) |
| shapes of dynamic inputs | ``--dim NAME=SIZE`` and ``--shape NAME=D1xD2...`` (repeatable) |
| where the model runs | ``--backend``, ``--device``, ``--place``, ``--strict``, ``--log-placement`` |
| the key of a protected model | ``--key-file`` / ``--key-env`` |

Options that take several values are repeatable (``--exclude a --exclude b``) or take one
comma-separated value (``--exclude a,b``), so none of them swallows a positional argument. Old
names stay as hidden aliases for one release (``--inputs`` and ``--calib`` for ``--data``).
"""

from __future__ import annotations

import argparse
import functools
import inspect
import os
import re
import time

import modelpress
from modelpress.errors import ModelpressError, OptionError
from modelpress.ir.files import output_dir
from modelpress.ir.shapes import parse_dims, parse_shapes
from modelpress.report.cards import model_card
from modelpress.report.page import write_report
from modelpress.report.record import Record
from modelpress.runtime.backend import backend_names

# Library errors name the keyword (`inputs`); the command line says the flag (--data).
FIELD_FLAGS = {
    "inputs": "--data",
    "data": "--data",
    "dims": "--dim",
    "shapes": "--shape",
    "runs": "--runs",
    "input_sets": "--input-sets",
    "rounds": "--rounds",
    "rtol": "--rtol",
    "atol": "--atol",
    "ort_level": "--ort-level",
    "others": "--vs",
    "threads": "--threads",
    "warmup": "--warmup",
    "max_accuracy_drop": "--max-accuracy-drop",
    "min_agreement": "--min-agreement",
    "min_cosine": "--min-cosine",
    "max_delay_s": "--max-delay-ms",
    "key": "--key-file FILE or --key-env VAR",
    "seq": "--seq",
    "ray_actors": "--replicas",
}


def flags_of(parser: argparse.ArgumentParser) -> dict[str, str]:
    """``{field: flag}`` of a command's parser: each option's destination and its long name."""
    out = {}
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and action.dest not in out:
            out[action.dest] = longs[0]
    return out


def in_flags(text: str, fields: dict[str, str]) -> str:
    """A library message with its field names (in backquotes) said as the command's flags."""
    mapping = {**FIELD_FLAGS, **fields}
    return re.sub(r"`(\w+)`", lambda m: mapping.get(m.group(1), m.group(0)), text)


def speaks_flags(func=None, *, fields: dict[str, str] | None = None):
    """Decorate a command's ``run``: the field names (in backquotes) of the library's error messages
    become the command's flags, so the same error reads right in Python and in a shell."""
    mapping = {**FIELD_FLAGS, **(fields or {})}

    def wrap(fn):
        @functools.wraps(fn)
        def run(args):
            try:
                return fn(args)
            except ModelpressError as exc:
                text = str(exc)
                new = in_flags(text, mapping)
                if new != text:
                    exc.args = (new,)
                raise

        return run

    return wrap(func) if func is not None else wrap


def add_command(
    sub,
    name: str,
    doc: str | None,
    *,
    help: str,
    epilog: str | None = None,
    examples: list[str] | tuple[str, ...] = (),
) -> argparse.ArgumentParser:
    """The parser of command ``name``: ``modelpress --help`` lists it with ``help``; its own
    ``--help`` describes it with ``doc``, the command module's docstring (one text for the reader
    of the code and the user), then ``epilog`` (lists the command reads from a registry) and the
    ``examples`` (command lines), laid out as written."""
    tail = [epilog] if epilog else []
    if examples:
        lead = "examples:" if len(examples) > 1 else "example:"
        tail.append("\n".join([lead, *(f"  {e}" for e in examples)]))
    return sub.add_parser(
        name,
        help=help,
        description=inspect.cleandoc(doc) if doc else None,
        epilog="\n\n".join(tail) or None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_model(
    p: argparse.ArgumentParser, *, help: str | None = None, required: bool = True
) -> None:
    p.add_argument(
        "model",
        metavar="MODEL",
        nargs=None if required else "?",
        help=help or "an .onnx file (a protected .mpk with --key-file)",
    )


def add_output(
    p: argparse.ArgumentParser, *, required: bool = True, help: str | None = None
) -> None:
    p.add_argument(
        "-o",
        "--output",
        required=required,
        metavar="FILE",
        help=help or "where to write the result",
    )


def add_record(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--json",
        metavar="FILE",
        help="also write the command's record (what it did and measured) as JSON, for `modelpress report`",
    )


def add_report(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--report",
        metavar="FILE.html",
        help="also write a self-contained HTML page of this run (model card, charts)",
    )


def add_data(
    p: argparse.ArgumentParser,
    *,
    required: bool = False,
    help: str | None = None,
    labels: bool = False,
    batch: bool = False,
    limit: bool = False,
) -> None:
    p.add_argument(
        "--data",
        metavar="PATH",
        required=required,
        help=help or "samples: an .npz of arrays named after the model's inputs",
    )
    p.add_argument("--inputs", "--calib", dest="data", help=argparse.SUPPRESS)
    if labels:
        p.add_argument("--labels-key", metavar="KEY", help="the array of labels in the --data .npz")
    if batch:
        p.add_argument("--batch-size", type=int, metavar="N", help="samples per model run")
    if limit:
        p.add_argument("--limit", type=int, metavar="N", help="use at most N samples of --data")
        p.add_argument("--calib-limit", dest="limit", type=int, help=argparse.SUPPRESS)


def add_inputs(p: argparse.ArgumentParser, *, to: str, shapes: bool = True) -> None:
    """The inputs a command runs the model on (``to``: "to time on"): the user's ``--data`` .npz,
    or inputs generated to fit the model, sized by ``--dim``/``--shape`` (``shapes``)."""
    add_data(
        p,
        help=f"inputs {to} (an .npz of arrays named after the model's inputs) instead of generated ones",
    )
    if shapes:
        add_shapes(p)


def add_shapes(p: argparse.ArgumentParser, *, full_shapes: bool = True) -> None:
    p.add_argument(
        "--dim",
        action="append",
        metavar="NAME=SIZE",
        help="size of a named dynamic dimension (repeatable), e.g. batch=8",
    )
    if full_shapes:
        p.add_argument(
            "--shape",
            action="append",
            metavar="NAME=DxD...",
            help="the whole shape of an input (repeatable), e.g. x=1x3x224x224",
        )


def add_device(p: argparse.ArgumentParser, *, default_backend: str = "ort") -> None:

    add_with_default(
        p, "--backend", default=default_backend, choices=backend_names(), help="execution backend"
    )
    add_with_default(p, "--device", default="auto", help="auto, cpu, cuda, cuda:N, mps, ...")
    p.add_argument(
        "--place",
        action="append",
        metavar="PATTERN=DEVICE",
        help="pin an op type or node-name glob to a device (repeatable)",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="fail instead of falling back to the CPU when a device is missing",
    )
    p.add_argument(
        "--log-placement",
        action="store_true",
        help="print node → device and the copies between devices",
    )


def add_ray(p: argparse.ArgumentParser, *, on: str, replicas: str) -> None:
    """``--ray [ADDRESS]`` (run ``on`` Ray: a local cluster, or the one at ADDRESS) and
    ``--replicas N``."""
    p.add_argument(
        "--ray",
        nargs="?",
        const=True,
        default=False,
        metavar="ADDRESS",
        help=f"{on} (a local cluster, or the one at ADDRESS); needs the ray extra",
    )
    p.add_argument("--replicas", type=int, metavar="N", help=replicas)


def add_key(p: argparse.ArgumentParser) -> None:
    p.add_argument("--key-file", metavar="FILE", help="the key of a protected model (.mpk)")
    p.add_argument("--key-env", metavar="VAR", help="an environment variable holding the key (hex)")


def add_with_default(p: argparse.ArgumentParser, *flags: str, default, help: str, **kwargs):
    """An option whose ``--help`` ends with "(default X)", X written from the value the parser fills
    in, so the help cannot say another default than the code uses. ``kwargs`` go to argparse."""
    shown = f"{default:g}" if isinstance(default, float) else default
    return p.add_argument(*flags, default=default, help=f"{help} (default {shown})", **kwargs)


def add_list(p: argparse.ArgumentParser, flag: str, *, metavar: str, help: str) -> argparse.Action:
    """A repeatable option whose values may also be comma-separated: ``--exclude a,b --exclude c``."""
    return p.add_argument(
        flag,
        action="append",
        default=[],
        metavar=metavar,
        help=f"{help} (repeatable, or comma-separated)",
    )


def hidden_alias(p: argparse.ArgumentParser, action: argparse.Action, *old: str) -> None:
    """``old`` spellings of ``action``'s option that still parse (into the same place) but are no
    longer shown: one name for one idea in ``--help``, nothing broken for a script."""
    kwargs: dict = {"dest": action.dest, "help": argparse.SUPPRESS, "default": argparse.SUPPRESS}
    if isinstance(action, argparse._AppendAction):
        kwargs.update(action="append", metavar=action.metavar)
    elif action.nargs == 0:
        kwargs.update(action="store_const", const=action.const)
    else:
        kwargs.update(
            type=action.type, nargs=action.nargs, const=action.const, metavar=action.metavar
        )
    p.add_argument(*old, **kwargs)


# The old spellings of renamed options, by command: they parse for one release, into the same
# place as the new name, and are never shown (``hidden_alias``). One table, so that a rename and
# its end are one line each. (``--inputs``/``--calib`` for ``--data`` live in ``add_data``.)
OLD_SPELLINGS: dict[str, dict[str, tuple[str, ...]]] = {
    "advise": {"--batch-size": ("--batch",)},
    "compress": {"--exclude": ("--keep",)},
    "convert": {"--ops": ("--level",)},
    "demo": {"--output": ("--out",), "--runs": ("--rounds",)},
    "optimize": {"--input-sets": ("--runs",)},
    "protect": {"--strength": ("--ratio",), "--obfuscation": ("--mode",)},
    "prune": {"--exclude": ("--keep",), "--rounds": ("--iterations",)},
    "quantize": {"--ops": ("--level",), "--window": ("--seq-len",)},
    "run": {"--replicas": ("--ray-actors",)},
    "verify": {
        "--input-sets": ("--runs",),
        "--greedy-tokens": ("--steps",),
        "--text-tokens": ("--max-tokens",),
    },
}


def add_old_spellings(command: str, p: argparse.ArgumentParser) -> None:
    """The ``OLD_SPELLINGS`` of ``command`` as hidden aliases of its options."""
    for flag, old in OLD_SPELLINGS.get(command, {}).items():
        hidden_alias(p, p._option_string_actions[flag], *old)  # argparse's index of its options


def listed(values: list[str] | None) -> list[str]:
    """The values of an ``add_list`` option, flattened."""
    return [v.strip() for value in values or [] for v in value.split(",") if v.strip()]


def dims(args: argparse.Namespace) -> dict[str, int]:

    return parse_dims(getattr(args, "dim", None))


def shapes(args: argparse.Namespace) -> dict[str, tuple[int, ...]]:

    return parse_shapes(getattr(args, "shape", None))


def open_model(
    path: str | os.PathLike, args: argparse.Namespace | None = None, *, runnable: bool = True
):
    """The model at ``path`` in memory: an ONNX file loaded, or a protected model (an ``.mpk``
    package, or an obfuscated ONNX file) opened in memory with the key options of ``args``. The
    one way every command reads its model. ``runnable=False`` (inspect) lets an obfuscated ONNX
    file without a key through as the file shows it."""

    return modelpress.open(
        path,
        key_file=getattr(args, "key_file", None),
        key_env=getattr(args, "key_env", None),
        runnable=runnable,
    )


class Recorder:
    """The command's record, written through the report schema when ``--json`` was given, and its
    page when ``--report`` was (``add_report``).

    ``models`` (role → ``onnx_ir.Model``) become model cards; ``charts`` is data for charts the
    result does not hold (``report.cards.advisor_charts``). Both are computed only when a record
    or a page is asked for."""

    def __init__(self, command: str, args: argparse.Namespace) -> None:
        self.command = command
        self.args = args
        self.started = time.time()
        # a record that cannot be written fails the command before it writes anything else
        for path in (getattr(args, "json", None), getattr(args, "report", None)):
            if path:
                output_dir(path)

    @property
    def wanted(self) -> bool:
        return bool(getattr(self.args, "json", None) or getattr(self.args, "report", None))

    def record(self, result: dict, *, models: dict | None = None, charts: dict | None = None):

        cards = {
            role: m if isinstance(m, dict) else model_card(m, name=role)
            for role, m in (models or {}).items()
            if m is not None
        }
        return Record.of(
            self.command, self.args, result, started=self.started, models=cards, charts=charts
        )

    def write(
        self, result: dict, *, models: dict | None = None, charts: dict | None = None
    ) -> None:
        path = getattr(self.args, "json", None)
        if path:
            self.record(result, models=models, charts=charts).write(path)
        self.write_page(result, models=models, charts=charts)

    def write_page(
        self, result: dict, *, models: dict | None = None, charts: dict | None = None
    ) -> None:
        """Only the page (``--report``): for a command whose ``--json`` still writes its own format."""
        page = getattr(self.args, "report", None)
        if not page:
            return

        record = self.record(result, models=models, charts=charts)
        write_report([record], page, title=f"modelpress {self.command}")


def same_named(args: argparse.Namespace, *names: str) -> dict:
    """The values of the options ``names`` as keywords of the library function that takes them
    under the same names (one word for one idea in the CLI and in the library)."""
    return {name: getattr(args, name) for name in names}


def require_positive(value: int | None, flag: str) -> None:
    if value is not None and value < 1:
        raise OptionError(f"{flag} must be at least 1")


def add_training_data(p: argparse.ArgumentParser, *, required: bool = False) -> None:
    """``--data`` as the commands that train read it (with labels, a batch size and a limit)."""
    add_data(
        p,
        required=required,
        help="training data: an .npz of arrays named after the model's inputs, or a folder of images in class subfolders",
        labels=True,
        batch=True,
        limit=True,
    )


def add_training(
    p: argparse.ArgumentParser,
    *,
    teacher: bool = True,
    epochs: int = 2,
    temperature: float = 1.0,
    no_train: bool = True,
    budget: bool = True,
) -> None:
    """How a command that trains (prune, distill, compress, quantize --mode qat) trains; the help
    shows the defaults the command uses (``--steps`` wins over ``--epochs``). With ``budget``, what
    the result must keep of the original (``add_budget``)."""
    g = p.add_argument_group("training")
    add_with_default(
        g, "--epochs", type=int, default=epochs, metavar="N", help="passes over the training data"
    )
    g.add_argument("--steps", type=int, metavar="N", help="optimizer steps (instead of epochs)")
    g.add_argument("--lr", type=float, metavar="X", help="learning rate (default 3e-3; qat 1e-4)")
    g.add_argument(
        "--optimizer", default="adam", choices=["adam", "adamw", "sgd"], help="default adam"
    )
    add_with_default(
        g,
        "--schedule",
        default="cosine",
        choices=["cosine", "linear", "constant"],
        help="learning-rate schedule after warm-up",
    )
    add_with_default(
        g,
        "--val-fraction",
        type=float,
        default=0.1,
        metavar="X",
        help="samples held out for early stopping and the check",
    )
    g.add_argument(
        "--patience",
        type=int,
        metavar="N",
        help="stop after N held-out evaluations without improvement (default 5; 10 a run)",
    )
    add_with_default(g, "--seed", type=int, default=0, help="shuffling and split seed")
    if no_train:
        g.add_argument("--no-train", action="store_true", help="no training: compress only")
    if teacher:
        g.add_argument(
            "--alpha",
            type=float,
            metavar="X",
            help="weight of the teacher's soft loss when labels exist too (default 0.5; 0: labels only)",
        )
        add_with_default(
            g,
            "--temperature",
            type=float,
            default=temperature,
            metavar="T",
            help="softmax temperature of the soft loss",
        )
        g.add_argument(
            "--soft-loss",
            default="auto",
            choices=["auto", "kl", "mse", "cosine"],
            help="loss against the teacher's outputs (default auto: kl for class scores, mse otherwise)",
        )
    if budget:
        add_budget(p)


def add_batching(p: argparse.ArgumentParser) -> None:
    add_with_default(
        p,
        "--batching",
        default="auto",
        choices=["auto", "per-sample", "whole"],
        help="whether requests or items may be joined into batches: auto decides by running a batch of 2 against two single samples; per-sample or whole overrides it",
    )


def batching_rule(args: argparse.Namespace):
    """The one batching decision of ``serve`` and ``run`` (``verify.batching``), as a function of
    a way to run the model (``rule(run)``), so that it is made on the command's own session."""
    from modelpress.verify.batching import decide_batching

    override = getattr(args, "batching", None)

    def rule(model):
        return lambda run: decide_batching(model, run, override=override)

    return rule


def add_budget(p: argparse.ArgumentParser) -> None:
    """What a command that trains must keep of the original (``compress.train.budget``)."""
    g = p.add_argument_group(
        "budget (checked on held-out samples, as ONNX Runtime runs the result)"
    )
    g.add_argument(
        "--max-accuracy-drop",
        type=float,
        default=0.02,
        metavar="X",
        help="with labels: the most top-1 accuracy may drop (default 0.02, two points)",
    )
    add_with_default(
        g,
        "--min-agreement",
        type=float,
        default=0.90,
        metavar="X",
        help="class scores without labels: the least top-1 agreement with the original",
    )
    add_with_default(
        g,
        "--min-cosine",
        type=float,
        default=0.90,
        metavar="X",
        help="other outputs: the least mean cosine with the original's",
    )
    g.add_argument(
        "--keep-anyway",
        action="store_true",
        help="write the result even when it is outside the budget",
    )


def add_search_budget(p: argparse.ArgumentParser, *, drop: str, time: str) -> None:
    """What a search (``auto``, ``deploy``) may spend: accuracy (``--max-accuracy-drop``, a fraction
    of the metric) and time (``--time-budget``, a duration)."""
    add_with_default(p, "--max-accuracy-drop", type=float, default=0.01, metavar="X", help=drop)
    add_with_default(p, "--time-budget", default="10m", metavar="DURATION", help=time)


def budget(args: argparse.Namespace):
    """The ``Budget`` of ``add_budget``'s options."""
    from modelpress.compress.train.budget import Budget

    return Budget(
        max_accuracy_drop=args.max_accuracy_drop,
        min_agreement=args.min_agreement,
        min_cosine=args.min_cosine,
    )


def training_args(args: argparse.Namespace, *, train=None) -> dict:
    """The library's keywords for what ``add_training_data`` and ``add_training`` set: the data,
    its labels and limit, the fine-tuning (``training_config``, unless ``train`` is given) and the
    loss against the teacher. One mapping for prune, distill and deep_compress."""
    return {
        "data": args.data,
        "labels_key": args.labels_key,
        "limit": args.limit,
        "train": training_config(args) if train is None else train,
        "alpha": args.alpha,
        "temperature": args.temperature,
        "soft": args.soft_loss,
    }


def training_config(args: argparse.Namespace, *, batch_default: int = 32, lr_default: float = 3e-3):
    """The ``TrainConfig`` of ``add_training``'s options, or False for ``--no-train``."""
    if getattr(args, "no_train", False):
        return False
    from modelpress.compress.train import TrainConfig

    return TrainConfig(
        epochs=args.epochs,
        steps=args.steps,
        batch_size=getattr(args, "batch_size", None) or batch_default,
        lr=args.lr if args.lr is not None else lr_default,
        optimizer=args.optimizer,
        schedule=args.schedule,
        val_fraction=args.val_fraction,
        # real data overfits: stop when the held-out loss has not improved for 5 checks (half a run)
        patience=args.patience if args.patience is not None else 5,
        seed=args.seed,
    )
