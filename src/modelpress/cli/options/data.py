"""The samples a command runs the model on (``--data``; a folder of images read as
``--image-size`` and its kin say) and the shapes of dynamic inputs (``--dim``, ``--shape``)."""

from __future__ import annotations

import argparse

from modelpress.cli.options.command import add_switch, add_with_default
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


def add_image_folder(p: argparse.ArgumentParser) -> None:
    """How a folder of images becomes inputs (``image_preprocess``)."""
    p.add_argument(
        "--image-size", type=int, nargs=2, metavar=("H", "W"), help="image folders: resize to H W"
    )
    p.add_argument(
        "--crop", type=int, nargs=2, metavar=("H", "W"), help="image folders: centre crop"
    )
    for flag, default, metavar, what in (
        ("--mean", 0.0, "M[,M,M]", "per-channel mean after scaling to 0..1"),
        ("--std", 1.0, "S[,S,S]", "per-channel std"),
    ):
        p.add_argument(
            flag,
            type=_floats,
            default=(default,),
            metavar=metavar,
            help=f"image folders: {what} (comma-separated; default {default:g})",
        )
    add_with_default(
        p, "--layout", default="NCHW", choices=["NCHW", "NHWC"], help="image folders: layout"
    )
    add_switch(p, "--grayscale", "image folders: one channel")


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected numbers separated by commas"
        ) from None


def image_preprocess(args: argparse.Namespace):
    """The ``ImagePreprocess`` of ``add_image_folder``'s options; None when none was given."""
    if not (args.image_size or args.crop or args.grayscale):
        return None
    from modelpress.compress.quantize import ImagePreprocess

    return ImagePreprocess(
        size=tuple(args.image_size) if args.image_size else None,
        crop=tuple(args.crop) if args.crop else None,
        mean=tuple(args.mean),
        std=tuple(args.std),
        layout=args.layout,
        mode="L" if args.grayscale else "RGB",
    )
