"""Where and how the model runs: the backend and device (``--backend``, ``--device``,
``--place``, ``--strict``, ``--log-placement``), Ray, and batching."""

from __future__ import annotations

import argparse

from modelpress.cli.options.command import add_switch, add_with_default, keywords
from modelpress.runtime.backend import backend_names
from modelpress.verify.batching import OVERRIDES, decide_batching


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
    add_switch(p, "--strict", "fail instead of falling back to the CPU when a device is missing")
    add_switch(p, "--log-placement", "print node → device and the copies between devices")


def placement(args: argparse.Namespace) -> dict:
    """The library's keywords for ``add_device``'s options (``--log-placement`` is the command's
    own: it prints the plan the library returns)."""
    return keywords(args, "backend", "device", "place", "strict")


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


def add_batching(p: argparse.ArgumentParser) -> None:
    add_with_default(
        p,
        "--batching",
        default="auto",
        choices=OVERRIDES,
        help="whether requests or items may be joined into batches: auto decides by running a batch of 2 against two single samples; per-sample or whole overrides it",
    )


def batching_rule(args: argparse.Namespace):
    """The one batching decision of ``serve`` and ``run`` (``verify.batching``), as a function of
    a way to run the model (``rule(run)``), so that it is made on the command's own session."""
    override = getattr(args, "batching", None)

    def rule(model):
        return lambda run: decide_batching(model, run, override=override)

    return rule
