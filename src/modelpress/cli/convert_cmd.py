"""modelpress convert SRC -o OUT: a PyTorch/TensorFlow/Keras model to ONNX, verified against the source.

Convert a framework model to standard ONNX, then run the original and the ONNX model on the same
inputs and compare them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from modelpress.cli import options
from modelpress.cli._common import console, human_bytes, print_notes
from modelpress.cli.verify_cmd import print_verify
from modelpress.convert import convert, parse_dynamic, parse_input_specs
from modelpress.convert.kinds import SOURCE_KINDS
from modelpress.convert.llm import LEVELS as LLM_LEVELS
from modelpress.convert.llm import LLMConvertResult
from modelpress.errors import OptionError
from modelpress.ir import graph_stats
from modelpress.ir.files import staging_dir
from modelpress.ir.io import model_bytes


def add_parser(sub) -> None:

    kinds = "\n".join(
        f"  {k.name:<14} {k.description}  [extra: {k.extra}]"
        for k in SOURCE_KINDS.values()
        if k.name not in ("torch-module", "keras-model")
    )
    p = options.add_command(
        sub,
        "convert",
        __doc__,
        help="convert a PyTorch, TensorFlow or Keras model to ONNX, verified against the original",
        epilog=f"sources:\n{kinds}\n\nexamples:\n  modelpress convert model.pt2 -o model.onnx --optimize\n"
        "  modelpress convert model.pt -o model.onnx --shape x=1x3x224x224 --dynamic x:0\n"
        "  modelpress convert saved_model/ -o model.onnx --opset 17\n"
        "  modelpress convert SmolLM2.gguf -o smollm2/          (a decoder LLM: an LLM folder)",
    )
    p.add_argument(
        "source",
        metavar="SOURCE",
        help="a .pt2, .pt, .keras, .h5 or .tflite file, a SavedModel directory, or a decoder LLM: "
        "a Hugging Face folder or a .gguf file",
    )
    options.add_output(p, help="where to write the ONNX model (the LLM folder, for a decoder)")
    p.add_argument("--opset", type=int, help="ONNX opset to target (default: the exporter's)")
    p.add_argument(
        "--shape",
        action="append",
        metavar="NAME=DxD..[:DTYPE]",
        help="shape (and dtype) of an input (repeatable; needed for .pt files), e.g. x=1x3x224x224",
    )
    p.add_argument("--input", action="append", dest="shape", help=argparse.SUPPRESS)  # the old name
    p.add_argument(
        "--dynamic",
        action="append",
        metavar="NAME:AXIS",
        help="keep this axis of an input dynamic (repeatable)",
    )
    options.add_switch(
        p, "--optimize", "then run modelpress's optimizer (level 2) and verify again"
    )
    options.add_switch(p, "--no-verify", "do not compare the ONNX model with the original")
    p.add_argument(
        "--rtol", type=float, help="relative tolerance (default per dtype: 1e-4 for float32)"
    )
    p.add_argument("--atol", type=float, help="absolute tolerance (default per dtype)")
    options.add_with_default(
        p,
        "--ops",
        choices=LLM_LEVELS,
        default="standard",
        help="decoder LLMs: standard writes ONNX ops only; ort uses ONNX Runtime's GroupQueryAttention and skip-norm fusions, a left-aligned cache",
    )
    options.add_switch(
        p,
        "--gguf-blocks",
        "a quantized .gguf: keep its own Q4_0/Q4_1/Q8_0 blocks (MatMulNBits, or "
        "DequantizeLinear at --ops standard) instead of float32 weights; the float model is "
        "still what is verified against transformers",
    )
    options.add_record(p)
    p.set_defaults(func=run)


def print_verify_table(title: str, result) -> None:
    print_verify(result, title)


@options.speaks_flags(
    fields={
        "inputs": "--shape",
        "level": "--ops",
    }
)
def run(args) -> int:

    record = options.Recorder("convert", args)
    if args.gguf_blocks:
        return run_gguf_blocks(args, record)
    console.print(f"converting {args.source} …")
    result = convert(
        args.source,
        output=args.output,
        opset=args.opset,
        inputs=parse_input_specs(args.shape),
        dynamic=parse_dynamic(args.dynamic),
        verify=not args.no_verify,
        optimize=args.optimize,
        rtol=args.rtol,
        atol=args.atol,
        level=args.ops,
    )
    if isinstance(result, LLMConvertResult):
        print_llm(result)
        record.write(result.to_dict())
        return 0
    stats = graph_stats(result.model)
    opsets = ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in stats.opsets.items())
    console.print(f"source kind {result.source_kind}, exporter {result.exporter}, opsets: {opsets}")
    print_notes(result.notes)
    if result.verify is not None:
        print_verify_table(f"ONNX vs original ({result.verify.runs} input sets)", result.verify)
    if result.optimized is not None:
        console.print(
            f"optimized: nodes {result.nodes_converted} → {stats.node_count}, {result.optimized.rewrites} rewrites"
        )
        if result.optimized_verify is not None:
            print_verify_table("optimized ONNX vs original", result.optimized_verify)
    verified = "verified" if result.verify is not None else "not verified (--no-verify)"
    console.print(
        f"wrote {result.output} ({stats.node_count} nodes, {human_bytes(len(model_bytes(result.model)))}), "
        f"{verified}, {result.seconds:.1f} s"
    )
    record.write(result.to_dict())
    return 0


def run_gguf_blocks(args, record) -> int:
    """``convert X.gguf --gguf-blocks``: the float folder (verified) in a staging folder beside
    the output, then the GGUF's own blocks put into it (``compress.llm.import_gguf_blocks``)."""
    from modelpress.compress.llm import import_gguf_blocks

    if Path(args.source).suffix.lower() != ".gguf":
        raise OptionError(f"--gguf-blocks: {args.source} is not a .gguf file")
    console.print(f"converting {args.source} (float, to check it) …")
    with staging_dir(args.output) as stage:
        result = convert(
            args.source,
            output=stage / "float",
            verify=not args.no_verify,
            rtol=args.rtol,
            atol=args.atol,
            level=args.ops,
        )
        print_llm(result)
        imported = import_gguf_blocks(stage / "float", args.source, args.output, level=args.ops)
    print_notes(imported.notes)
    types = ", ".join(sorted(set(imported.imported.values())))
    console.print(
        f"wrote {imported.output}/ with {len(imported.imported)} weights as the GGUF's own blocks "
        f"({types}), {len(imported.kept_float)} kept float"
    )
    record.write({**result.to_dict(), "output": imported.output, "gguf_blocks": imported.to_dict()})
    return 0


def print_llm(result: LLMConvertResult) -> None:
    c = result.config
    console.print(
        f"{result.source_kind} checkpoint, family {c.family}: {c.num_layers} layers, "
        f"{c.num_kv_heads} kv heads of {c.head_dim}, vocab {c.vocab_size}, context {c.max_context}"
        + (f", sliding window {c.sliding_window}" if c.sliding_window else "")
    )
    check = result.verify
    if check is not None:
        console.print(
            f"vs transformers (fp32): prompt of {check.prompt_tokens} tokens max abs "
            f"{check.prompt_max_abs:.2g}, {check.steps} greedy steps through the cache max abs "
            f"{check.decode_max_abs:.2g}, padded batch max abs {check.padded_max_abs:.2g} "
            f"(tolerance {check.tolerance:.2g}); greedy tokens equal"
        )
    verified = "verified" if check is not None else "not verified (--no-verify)"
    console.print(
        f"wrote {result.output}/ (level {c.level}, {result.nodes} nodes, "
        f"{result.parameters / 1e6:.1f}M parameters), {verified}, {result.seconds:.1f} s"
    )
