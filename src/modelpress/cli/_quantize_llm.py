"""``modelpress quantize LLM_DIR -o OUT_DIR --mode int4``: the LLM folder's route of quantize."""

from __future__ import annotations

import argparse

from rich.table import Table

from modelpress.cli import options
from modelpress.cli._common import console, counted, human_bytes
from modelpress.compress.llm import quantize_llm
from modelpress.compress.llm.quantize import EMBEDDINGS, LEVELS, METHODS
from modelpress.errors import OptionError

LLM_MODES = {"int4": 4, "int8": 8}


def add_llm_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("LLM folders (--mode int4|int8; --data is a text file)")
    options.add_with_default(
        g,
        "--algorithm",
        choices=METHODS,
        default="auto",
        help="auto: per layer the least held-out error of AWQ-scaled clip search, GPTQ and GPTQ with act-order; rtn: round to nearest, no calibration. Without --data, int4 calibrates on text sampled from the model itself",
    )
    g.add_argument(
        "--symmetric", action="store_true", help="int4 without zero points (default: asymmetric)"
    )
    g.add_argument(
        "--act-order",
        choices=["auto", "on", "off"],
        default="auto",
        help="GPTQ's order: decreasing activation energy (on), K order (off), both tried (auto; default auto)",
    )
    options.add_with_default(
        g,
        "--embeddings",
        choices=list(EMBEDDINGS),
        default="int8",
        help="the embedding table and LM head (tied or not): int8, int4 or float",
    )
    options.add_with_default(
        g,
        "--ops",
        choices=list(LEVELS),
        default="ort",
        help="ort: MatMulNBits/GatherBlockQuantized; standard: DequantizeLinear + MatMul",
    )
    options.add_with_default(
        g, "--window", type=int, default=512, metavar="N", help="tokens per calibration window"
    )
    g.add_argument(
        "--stages",
        type=int,
        default=1,
        metavar="N",
        help="sequential calibration: inputs of each of N runs of layers measured through the "
        "runs already quantized (default 1: all from the float model; costs N-1 more passes)",
    )
    g.add_argument(
        "--float-zero-points",
        action="store_true",
        help="int4 MatMulNBits: each block's own min/max range with a float zero point "
        "(exact on weights from Q4_1-style blocks; default: integer zero points)",
    )
    g.add_argument(
        "--int8-layers",
        type=int,
        default=None,
        metavar="N",
        help="int4: keep the N MatMuls most hurt by 4 bits at 8 bits, measured end to end "
        "(default: a tenth of them with calibration text, --data or sampled; 0: all at 4 bits)",
    )
    g.add_argument(
        "--tune-steps",
        type=int,
        default=0,
        metavar="N",
        help="then N steps tuning the block scales against the float model on --data "
        "(distillation; kept only if the held-out KL drops; default 0: off)",
    )


def run_llm(args) -> int:
    recorder = options.Recorder("quantize", args)
    options.require_positive(args.window, "--window")
    options.require_positive(args.stages, "--stages")
    if args.int8_layers is not None and args.int8_layers < 0:
        raise OptionError("--int8-layers must be at least 0")
    if args.tune_steps < 0:
        raise OptionError("--tune-steps must be at least 0")
    sampled = (args.mode or "int4") == "int4" and args.algorithm != "rtn"
    if args.tune_steps and not args.data and not sampled:
        raise OptionError("--tune-steps needs calibration text: give --data (a text file)")
    with counted("quantizing") as progress:
        result = quantize_llm(
            args.model,
            args.output,
            mode=args.mode or "int4",
            block_size=args.block_size,
            symmetric=args.symmetric,
            method=args.algorithm,
            act_order={"auto": None, "on": True, "off": False}[args.act_order],
            data=args.data,
            embeddings=args.embeddings,
            level=args.ops,
            seq_len=args.window,
            samples=args.limit or 32,
            stages=args.stages,
            int8_layers=args.int8_layers,
            float_zero_points=args.float_zero_points,
            tune_steps=args.tune_steps,
            progress=progress,
        )
    t = Table(
        title=f"{result.mode} blocks of {result.block_size} ({result.method})", show_edge=False
    )
    for col in ("layer", "K×N", "bits", "kept", "AWQ α", "rel. error"):
        t.add_column(col)
    for layer in result.layers:
        t.add_row(
            layer.name,
            f"{layer.k}×{layer.n}",
            str(layer.bits),
            layer.method,
            f"{layer.alpha:g}",
            "" if layer.rel_error is None else f"{layer.rel_error:.2e}",
        )
    console.print(t)
    if result.tuning is not None:
        r = result.tuning
        console.print(
            f"tuned {r.scales} block scales of {r.weights} weights in {r.steps} steps "
            f"({r.seconds:.0f} s): KL from the float model {r.loss_before:.4g} → "
            f"{r.loss_after:.4g} nats/token on the training windows, held out "
            f"{r.held_out_before:.4g} → {r.held_out_after:.4g}" + ("" if r.kept else " (not kept)")
        )
    for note in result.notes:
        console.print(f"note: {note}")
    console.print(
        f"wrote {result.output}: {human_bytes(result.size_before)} → "
        f"{human_bytes(result.size_after)} ({result.size_after / max(result.size_before, 1):.2f}x) "
        f"in {result.seconds:.1f} s; kept: "
        + ", ".join(f"{k} {v}" for k, v in result.methods_kept().items())
    )
    recorder.write({**result.to_dict(), "written": result.output})
    return 0
