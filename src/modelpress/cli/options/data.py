"""The samples a command runs the model on (``--data``) and the shapes of dynamic inputs
(``--dim``, ``--shape``)."""

from __future__ import annotations

import argparse

from modelpress.ir.shapes import parse_dims, parse_shapes


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


def dims(args: argparse.Namespace) -> dict[str, int]:

    return parse_dims(getattr(args, "dim", None))


def shapes(args: argparse.Namespace) -> dict[str, tuple[int, ...]]:

    return parse_shapes(getattr(args, "shape", None))
