"""``modelpress verify A_DIR B_DIR --data text.txt``: the LLM folders' route of verify."""

from __future__ import annotations

import argparse

from rich.table import Table

from modelpress.cli import options
from modelpress.cli._common import console
from modelpress.errors import OptionError
from modelpress.verify.llm import verify_llm


def add_llm_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("LLM folders (--data is a text file)")
    options.add_with_default(
        g, "--window", type=int, default=512, metavar="N", help="tokens per scored window"
    )
    options.add_with_default(
        g, "--stride", type=int, default=256, metavar="N", help="tokens between windows"
    )
    g.add_argument(
        "--text-tokens", type=int, metavar="N", help="score only the text's first N tokens"
    )
    options.add_with_default(
        g, "--prompts", type=int, default=8, metavar="N", help="prompts for top-1 agreement"
    )
    options.add_with_default(
        g, "--greedy-tokens", type=int, default=32, metavar="N", help="greedy tokens per prompt"
    )


def run_llm(args) -> int:
    record = options.Recorder("verify", args)
    if not args.data:
        raise OptionError("--data: two LLM folders are compared on a text file (--data text.txt)")
    for flag in ("window", "stride", "prompts", "greedy_tokens", "text_tokens"):
        options.require_positive(getattr(args, flag), "--" + flag.replace("_", "-"))
    r = verify_llm(
        args.reference,
        args.candidate,
        args.data,
        window=args.window,
        stride=args.stride,
        text_tokens=args.text_tokens,
        prompts=args.prompts,
        greedy_tokens=args.greedy_tokens,
    )
    t = Table(show_edge=False)
    for col in ("", "perplexity", "tokens"):
        t.add_column(col)
    for role in ("reference", "candidate"):
        t.add_row(role, f"{r.perplexity[role]:.4f}", str(r.details[role]["tokens"]))
    console.print(t)
    agreement = r.details["agreement"]
    console.print(
        f"perplexity ratio {r.ratio:.4f} ({(r.ratio - 1) * 100:+.2f}%); top-1 agreement "
        f"{r.top1_agreement:.4f} over {agreement['positions']} greedy positions "
        f"({agreement['prompts']} prompts × {agreement['steps']} tokens)"
    )
    record.write(r.to_dict())
    return 0
