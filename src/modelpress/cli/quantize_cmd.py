"""modelpress quantize IN -o OUT: int8/int4/fp16 quantization, checked against the float model."""

from __future__ import annotations

import argparse
from itertools import islice

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from modelpress.cli._common import console, human_bytes, write_json


def add_parser(sub) -> None:
    from modelpress.compress.quantize.api import MODES
    from modelpress.compress.quantize.observers import OBSERVERS

    p = sub.add_parser(
        "quantize",
        help="quantize a model (static/dynamic int8, weight-only int8/int4, fp16/bf16)",
        description="Quantize a model to standard ONNX (QDQ / integer ops), report the per-layer error, "
        "and check the result against the float model.",
        epilog="examples:\n"
        "  modelpress quantize cnn.onnx -o int8.onnx --mode static --calib calib.npz\n"
        "  modelpress quantize bert.onnx -o int8.onnx --mode dynamic --calib sentences.npz\n"
        "  modelpress quantize bert.onnx -o int4.onnx --mode weight-only --bits 4 --block-size 32\n"
        "  modelpress quantize cnn.onnx -o int8.onnx --calib val.npz --labels-key label --max-accuracy-drop 0.003",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="an .onnx file")
    p.add_argument("-o", "--output", required=True, help="where to write the quantized model")
    p.add_argument("--mode", default="static", choices=list(MODES), help="default: static")
    p.add_argument(
        "--calib",
        metavar="PATH",
        help="calibration data: an .npz, a folder of .npz batches, or a folder of images",
    )
    p.add_argument(
        "--method",
        default="minmax",
        choices=sorted(set(OBSERVERS) | {"kl"}),
        help="calibration observer for static mode (default minmax)",
    )
    p.add_argument(
        "--per-tensor",
        action="store_true",
        help="one weight scale per tensor instead of per channel",
    )
    p.add_argument(
        "--bits",
        type=int,
        default=8,
        choices=[8, 4],
        help="weight-only: bits per weight (default 8); 4 bits are rounded by GPTQ on the --calib "
        "data (on generated inputs without it: give --calib for the best accuracy)",
    )
    p.add_argument(
        "--block-size",
        type=int,
        default=32,
        help="weight-only 4-bit: elements per scale (default 32)",
    )
    p.add_argument(
        "--activation-type",
        default="uint8",
        choices=["uint8", "int8"],
        help="static: activation type (default uint8, fastest on x86)",
    )
    p.add_argument("--no-bias-correction", action="store_true", help="static: skip bias correction")
    p.add_argument(
        "--no-gptq",
        action="store_true",
        help="static and weight-only: round weights to nearest instead of by GPTQ",
    )
    p.add_argument(
        "--no-smooth",
        action="store_true",
        help="dynamic, and static on transformers: do not move activation outliers into the weights",
    )
    p.add_argument(
        "--exclude", nargs="+", metavar="NODE", default=[], help="nodes to keep in float"
    )
    p.add_argument(
        "--max-accuracy-drop",
        type=float,
        metavar="X",
        help="keep sensitive layers in float until the metric drops by at most X",
    )
    p.add_argument(
        "--labels-key",
        metavar="KEY",
        help="array of labels in the calibration .npz (top-1 accuracy metric)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=16,
        help="calibration batch size for a single .npz (default 16)",
    )
    p.add_argument("--calib-limit", type=int, metavar="N", help="use at most N calibration samples")
    p.add_argument(
        "--image-size", type=int, nargs=2, metavar=("H", "W"), help="image folders: resize to H W"
    )
    p.add_argument(
        "--crop", type=int, nargs=2, metavar=("H", "W"), help="image folders: centre crop"
    )
    p.add_argument(
        "--mean",
        type=float,
        nargs="+",
        default=[0.0],
        help="image folders: per-channel mean (after scaling to 0..1)",
    )
    p.add_argument(
        "--std", type=float, nargs="+", default=[1.0], help="image folders: per-channel std"
    )
    p.add_argument(
        "--layout", default="NCHW", choices=["NCHW", "NHWC"], help="image folders: layout"
    )
    p.add_argument("--grayscale", action="store_true", help="image folders: one channel")
    p.add_argument(
        "--no-optimize", action="store_true", help="do not run the optimizer (level 2) first"
    )
    p.add_argument(
        "--no-latency",
        action="store_true",
        help="skip the float-vs-quantized latency check on this CPU (about 2 s)",
    )
    p.add_argument(
        "--report",
        metavar="FILE",
        help="FILE.html: a page of this run (model cards, per-layer error chart, latency); "
        "another name: the per-layer report and summary as JSON",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from modelpress.compress.quantize import ImagePreprocess, quantize
    from modelpress.ir import load, save
    from modelpress.ir.files import output_dir
    from modelpress.verify import verify

    output_dir(args.output)  # before minutes of calibration, not after
    from modelpress.cli.options import Recorder

    recorder = Recorder("quantize", args)
    original = load(args.model)
    image = None
    if args.image_size or args.crop or args.grayscale:
        image = ImagePreprocess(
            size=tuple(args.image_size) if args.image_size else None,
            crop=tuple(args.crop) if args.crop else None,
            mean=tuple(args.mean),
            std=tuple(args.std),
            layout=args.layout,
            mode="L" if args.grayscale else "RGB",
        )
    with Progress(
        TextColumn("calibrating"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("calibrating", total=None)

        def progress(done: int, total: int | None) -> None:
            bar.update(task, completed=done, total=total)

        result = quantize(
            original,
            mode=args.mode,
            calibration=args.calib,
            method=args.method,
            per_channel=not args.per_tensor,
            bits=args.bits,
            block_size=args.block_size,
            activation_dtype=args.activation_type,
            bias_correction=not args.no_bias_correction,
            smooth=not args.no_smooth,
            gptq=not args.no_gptq,
            exclude=args.exclude,
            max_accuracy_drop=args.max_accuracy_drop,
            labels_key=args.labels_key,
            batch_size=args.batch_size,
            calibration_limit=args.calib_limit,
            image=image,
            optimize=not args.no_optimize,
            progress=progress,
        )
    _print_layers(result)
    for note in result.notes:
        console.print(f"note: {note}")
    # The result must run and stay close to the float model: measured on real or generated inputs.
    inputs = None
    if args.calib:
        from modelpress.compress.quantize.calibration import CalibrationSet

        cal = CalibrationSet.from_source(
            args.calib,
            batch_size=args.batch_size,
            labels_key=args.labels_key,
            image=image,
            limit=args.calib_limit,
        )
        inputs = [b.feeds for b in islice(cal.batches(original), 2)]
    verified = None
    if args.mode != "bf16":  # ONNX Runtime's CPU has no bfloat16 kernels for most ops
        verified = verify(original, result.model, inputs=inputs, rtol=float("inf"))
        console.print(f"output error vs float model: max relative {verified.max_rel:.3g}")
        if verified.max_rel == float("inf"):  # a NaN, an infinity or a shape the float model lacks
            from modelpress.errors import VerificationError

            raise VerificationError(
                "the quantized model's outputs have NaN, infinite values or shapes the float "
                f"model's do not; {args.output} not written"
            )
    if result.accuracy is not None:
        a = result.accuracy
        status = (
            "[green]within budget[/]"
            if a.met
            else "[red]budget not met[/] (best model found written)"
        )
        console.print(
            f"metric float {a.metric_float:.4f} → quantized {a.metric_quantized:.4f} (drop {a.drop:.4f}, budget {a.budget:g}): "
            f"{status}; kept in float: {', '.join(a.kept_float) or 'none'}"
        )
    save(result.model, args.output)
    latency = None
    if not args.no_latency and args.mode not in ("fp16", "bf16"):  # half types are for GPUs
        # against the float model as quantize saw it (optimized unless --no-optimize): the
        # optimizer's own gains are not int8's
        reference = original
        if not args.no_optimize:
            from modelpress.passes import optimize

            reference = optimize(original, level=2).model
        label = "float" if args.no_optimize else "float (optimized)"
        latency = _latency(reference, result.model, inputs[0] if inputs else None, label)
    console.print(
        f"wrote {args.output}: {human_bytes(result.size_before)} → {human_bytes(result.size_after)} "
        f"({result.size_after / max(result.size_before, 1):.2f}x) in {result.seconds:.1f} s"
    )
    if args.report:
        data = result.to_dict()
        data["verify"] = verified.to_dict() if verified else None
        data["latency_ms"] = latency
        if str(args.report).lower().endswith((".html", ".htm")):
            recorder.write_page(data, models={"input": original, "output": result.model})
        else:
            write_json(args.report, data)
    return 0


def _latency(original, quantized, feeds, label: str) -> dict | None:
    """Time the float and the quantized model on this CPU (ONNX Runtime) and say which is faster:
    int8 kernels do not pay off everywhere (tiny convolutions, CPUs without VNNI)."""
    from modelpress.runtime.measure import compare_latency
    from modelpress.verify.inputs import generate_inputs

    feeds = feeds or generate_inputs(original)
    try:
        before, after = compare_latency([original, quantized], feeds)
    except Exception as exc:  # noqa: BLE001 - the model was written; timing is a courtesy
        console.print(f"note: no latency check ({str(exc).splitlines()[0][:120]})")
        return None
    ratio = after.median_ms / max(before.median_ms, 1e-9)
    batch = next(iter(feeds.values())).shape[0] if feeds and next(iter(feeds.values())).ndim else 1
    console.print(
        f"latency on this CPU (ONNX Runtime, batch {batch}): {label} {before.median_ms:.3g} ms → "
        f"quantized {after.median_ms:.3g} ms ({ratio:.2f}x)"
    )
    out = {"float": before.to_dict(), "quantized": after.to_dict(), "ratio": ratio}
    if ratio > 1.0:
        console.print(
            "[yellow]warning[/]: the quantized model is not faster here; int8 pays off on larger "
            "layers and CPUs with VNNI/AMX (see `modelpress bench` to measure at your batch size)"
        )
        out["quantized_top_ops"] = top = _top_ops(quantized, feeds)
        if top:
            console.print(f"  where the quantized model spends its time: {top}")
    return out


def _top_ops(model, feeds, runs: int = 10) -> str:
    """The op types ONNX Runtime spends most of its kernel time in, from a few profiled runs
    (``QLinearMul 31%, QLinearConv 28%, ...``): which int8 kernels did not pay off."""
    import os
    import tempfile

    from modelpress.runtime import ort as mp_ort
    from modelpress.runtime.measure import op_profile

    so = mp_ort.session_options(profile=True)
    so.profile_file_prefix = os.path.join(tempfile.gettempdir(), "modelpress_quantize_profile")
    try:
        sess = mp_ort.session(model, options=so)
        for _ in range(runs):
            sess.run(None, feeds)
        rows = op_profile(sess.end_profiling())
    except Exception:  # noqa: BLE001 - a courtesy on top of the timing
        return ""
    total = sum(ms for _, ms, _ in rows) or 1.0
    return ", ".join(f"{op} {100 * ms / total:.0f}%" for op, ms, _ in rows[:4])


def _print_layers(result) -> None:
    if not result.layers:
        return
    t = Table(title=f"{result.mode} quantization", show_edge=False)
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
