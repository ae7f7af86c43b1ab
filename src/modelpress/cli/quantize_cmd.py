"""modelpress quantize MODEL -o OUT: int8/int4/fp16 quantization for a target CPU, checked as it
will run.

Quantize a model to standard ONNX (QDQ / integer ops) in the formats the target CPU runs exactly,
report the per-layer error, and check the result as ONNX Runtime runs it here. A result that fails
the check is not written (exit 1) unless --keep-anyway.
"""

from __future__ import annotations

from rich.table import Table

from modelpress.cli import options
from modelpress.cli._common import console, counted, human_bytes, print_notes, refuse_unless_kept
from modelpress.cli._quantize_llm import LLM_MODES, add_llm_options, run_llm
from modelpress.compress.quantize import quantize
from modelpress.compress.quantize.modes import MODES, mode_names
from modelpress.compress.quantize.observers import OBSERVERS
from modelpress.errors import OptionError
from modelpress.ir import save
from modelpress.ir.files import output_dir
from modelpress.ir.llm import is_llm_folder
from modelpress.runtime.cpu import TARGETS


def add_parser(sub) -> None:

    modes = "\n".join(f"  {name:<12} {MODES[name].help}" for name in mode_names())
    p = options.add_command(
        sub,
        "quantize",
        __doc__,
        help="quantize a model (static/dynamic int8, weight-only int8/int4, fp16/bf16)",
        epilog=f"modes:\n{modes}\n\nexamples:\n"
        "  modelpress quantize cnn.onnx -o int8.onnx --mode static --data calib.npz\n"
        "  modelpress quantize bert.onnx -o int8.onnx --mode dynamic --data sentences.npz\n"
        "  modelpress quantize bert.onnx -o int4.onnx --mode weight-only --bits 4 --block-size 32\n"
        "  modelpress quantize cnn.onnx -o int8.onnx --mode qat --data train.npz --labels-key y --epochs 2\n"
        "  modelpress quantize cnn.onnx -o int8.onnx --data val.npz --labels-key label --max-accuracy-drop 0.003\n"
        "  modelpress quantize cnn.onnx -o int8.onnx --data calib.npz --target-cpu portable\n"
        "  modelpress quantize llm_dir -o int4_dir --mode int4 --block-size 32 --data text.txt",
    )
    options.add_model(p)
    options.add_key(p)
    options.add_output(p, help="where to write the quantized model")
    p.add_argument(
        "--mode",
        choices=[*mode_names(), *LLM_MODES],
        help="default: static (an ONNX file), int4 (an LLM folder; int4 and int8 are its modes)",
    )
    options.add_data(
        p,
        help="calibration data: an .npz, a folder of .npz batches, or a folder of images",
        labels=True,
        limit=True,
    )
    options.add_with_default(
        p,
        "--batch-size",
        type=int,
        default=16,
        metavar="N",
        help="samples per model run in calibration",
    )
    options.add_shapes(p, full_shapes=False)
    options.add_with_default(
        p,
        "--target-cpu",
        default="auto",
        choices=["auto", *TARGETS],
        help="the CPU the int8 formats are for: auto (this one), vnni (x86 with VNNI/AMX), avx2 (x86 without VNNI), arm64, or portable (exact on all of them)",
    )
    options.add_with_default(
        p,
        "--method",
        default="minmax",
        choices=sorted(set(OBSERVERS) | {"kl"}),
        help="calibration observer for static mode",
    )
    options.add_switch(p, "--per-tensor", "one weight scale per tensor instead of per channel")
    p.add_argument(
        "--bits",
        type=int,
        default=8,
        choices=[8, 4],
        help="weight-only: bits per weight (default 8); 4 bits are rounded by GPTQ on the --data "
        "(on generated inputs without it: give --data for the best accuracy)",
    )
    options.add_with_default(
        p,
        "--block-size",
        type=int,
        default=32,
        help="weight-only 4-bit and LLM folders: elements per scale",
    )
    p.add_argument(
        "--activation-type",
        default="uint8",
        choices=["uint8", "int8"],
        help="static: activation type (default uint8, fastest on x86)",
    )
    options.add_switch(p, "--no-bias-correction", "static: skip bias correction")
    options.add_switch(
        p, "--no-gptq", "static and weight-only: round weights to nearest instead of by GPTQ"
    )
    options.add_switch(
        p,
        "--no-smooth",
        "dynamic, and static on transformers: do not move activation outliers into the weights",
    )
    options.add_list(p, "--exclude", metavar="NODE", help="a node to keep in float")
    p.add_argument(
        "--max-accuracy-drop",
        type=float,
        metavar="X",
        help="keep sensitive layers in float until the metric drops by at most X (a fraction: 0.01 is one point)",
    )
    options.add_image_folder(p)
    options.add_switch(p, "--no-optimize", "do not run the optimizer (level 2) first")
    options.add_switch(
        p,
        "--no-latency",
        "skip timing float against int8 on this CPU (static int8 must be faster; about 2 s)",
    )
    options.add_switch(
        p,
        "--keep-anyway",
        "write the model even when the check fails (larger, slower or less exact than it should be)",
    )
    add_llm_options(p)
    options.add_training(p, teacher=False, budget=False)  # qat mode
    options.add_record(p)
    p.add_argument(
        "--report",
        metavar="FILE.html",
        help="also write a self-contained HTML page of this run (model cards, per-layer error "
        "chart, latency)",
    )
    p.set_defaults(func=run)


# The library's field names → this command's flags, in its error messages.
FLAGS = {
    "calibration": "--data",
    "activation_dtype": "--activation-type",
    "image": "--image-size/--mean/--std/--layout",
    "level": "--ops",
    "seq_len": "--window",
}


@options.speaks_flags(fields=FLAGS)
def run(args) -> int:

    if is_llm_folder(args.model):
        return run_llm(args)
    if args.mode in LLM_MODES:
        raise OptionError(
            f"--mode {args.mode} is for LLM folders; for an ONNX file use "
            f"--mode weight-only --bits {LLM_MODES[args.mode]}"
        )
    args.mode = args.mode or "static"
    if args.report and not str(args.report).lower().endswith((".html", ".htm")):
        raise OptionError(
            f"--report {args.report}: the HTML page is FILE.html; the record is --json FILE"
        )
    recorder = options.Recorder("quantize", args)
    output_dir(args.output)  # before minutes of calibration, not after
    original = options.open_model(args.model, args)
    with counted("calibrating") as progress:
        result = quantize(
            original,
            **options.keywords(
                args,
                "mode",
                "data",
                "method",
                "bits",
                "block_size",
                "max_accuracy_drop",
                "labels_key",
                "batch_size",
                "limit",
                "target_cpu",
            ),
            per_channel=not args.per_tensor,
            activation_dtype=args.activation_type,
            bias_correction=not args.no_bias_correction,
            smooth=not args.no_smooth,
            gptq=not args.no_gptq,
            exclude=options.listed(args.exclude),
            image=options.image_preprocess(args),
            optimize=not args.no_optimize,
            dims=options.dims(args),
            check_latency=not args.no_latency,
            train=options.training_config(
                args, batch_default=args.batch_size or 16, lr_default=1e-4
            )
            if args.mode == "qat"
            else None,
            progress=progress,
        )
    _print_layers(result)
    print_notes(result.notes)
    _print_check(result)
    if result.accuracy is not None:
        a = result.accuracy
        status = (
            "[green]within budget[/]" if a.met else "[red]budget not met[/] (best model found kept)"
        )
        console.print(
            f"metric float {a.metric_float:.4f} → quantized {a.metric_quantized:.4f} (drop {a.drop:.4f}, budget {a.budget:g}): "
            f"{status}; kept in float: {', '.join(a.kept_float) or 'none'}"
        )
    data = result.to_dict()
    models = {"input": original, "output": result.model}
    refuse_unless_kept(args, result.failures, data, recorder, models=models)
    save(result.model, args.output)
    console.print(
        f"wrote {args.output}: {human_bytes(result.size_before)} → {human_bytes(result.size_after)} "
        f"({result.size_after / max(result.size_before, 1):.2f}x) in {result.seconds:.1f} s"
        + ("" if result.check is None or result.check.verified else " [yellow](not verified)[/]")
    )
    recorder.write({**data, "written": args.output}, models=models)
    return 0


def _print_check(result) -> None:
    c = result.check
    if c is None:
        return
    if result.target:
        console.print(f"int8 formats for: {result.target} CPUs; this CPU: {c.cpu['target']}")
    if c.deployed_error is not None:
        console.print(
            f"output error vs float model: {c.deployed_error:.3g} as ONNX Runtime runs it here "
            f"(default optimizations), {c.reference_error:.3g} for the arithmetic its scales imply"
        )
    if c.latency:
        lat = c.latency
        console.print(
            f"latency here (ONNX Runtime): float {lat['float']['median_ms']:.3g} ms → quantized "
            f"{lat['quantized']['median_ms']:.3g} ms ({lat['ratio']:.2f}x)"
        )


def _print_layers(result) -> None:
    if not result.layers:
        return
    t = Table(
        title=f"{result.mode} quantization (per layer: reference arithmetic)", show_edge=False
    )
    for col in ("layer", "op", "quantized", "SQNR dB", "rel. error"):
        t.add_column(col, justify="right" if col in ("SQNR dB", "rel. error") else "left")
    for layer in result.layers:
        t.add_row(
            layer.name,
            layer.op_type,
            "yes" if layer.quantized else "float",
            "" if layer.sqnr_db is None else f"{layer.sqnr_db:.1f}",
            "" if layer.rel_error is None else f"{layer.rel_error:.2e}",
        )
    console.print(t)
