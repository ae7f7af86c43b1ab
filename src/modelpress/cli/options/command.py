"""A command's parser and its words: the parser itself, the option helpers every group uses
(defaults said in the help, lists, switches, hidden old spellings), and the library's field names
said as the command's flags."""

from __future__ import annotations

import argparse
import functools
import inspect
import re

from modelpress.errors import ModelpressError, OptionError

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


def add_with_default(
    p: argparse.ArgumentParser, *flags: str, default, help: str, note: str | None = None, **kwargs
):
    """An option whose ``--help`` ends with "(default X)", or "(default X; ``note``)", X written
    from the value the parser fills in, so the help cannot say another default than the code uses.
    ``kwargs`` go to argparse."""
    shown = f"{default:g}" if isinstance(default, float) else default
    said = f"default {shown}; {note}" if note else f"default {shown}"
    return p.add_argument(*flags, default=default, help=f"{help} ({said})", **kwargs)


def add_list(p: argparse.ArgumentParser, flag: str, *, metavar: str, help: str) -> argparse.Action:
    """A repeatable option whose values may also be comma-separated: ``--exclude a,b --exclude c``."""
    return p.add_argument(
        flag,
        action="append",
        default=[],
        metavar=metavar,
        help=f"{help} (repeatable, or comma-separated)",
    )


def add_switch(p: argparse.ArgumentParser, flag: str, help: str) -> argparse.Action:
    """An on/off option: off unless given."""
    return p.add_argument(flag, action="store_true", help=help)


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


def keywords(args: argparse.Namespace, *names: str) -> dict:
    """The options ``names`` as the library's keywords of the same names: what a command passes on
    as the user gave it (the rest it converts by hand beside them)."""
    return {name: getattr(args, name) for name in names}


def require_positive(value: int | None, flag: str) -> None:
    if value is not None and value < 1:
        raise OptionError(f"{flag} must be at least 1")
