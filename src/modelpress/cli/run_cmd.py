"""modelpress run MODEL DATA -o predictions.jsonl: batch inference, resumable, in parallel.

Run a model over a data set: pre-processing in parallel worker processes, the model kept busy with
batches, answers written one JSON line per item; resumable after a kill.
"""

from __future__ import annotations

import argparse

from modelpress.cli import options
from modelpress.cli._common import console, err_console, transient_bar
from modelpress.cli.options import (
    Recorder,
    add_device,
    add_key,
    add_model,
    add_output,
    add_record,
    open_model,
    require_positive,
)
from modelpress.errors import OptionError
from modelpress.runtime.batch import refuse_overwrite, run_batch

EPILOG = """\
DATA is a folder of images (or .wav files), a .jsonl of texts (a JSON string a line, or
{"id": ..., "text": ...}) for a model that declares its processing (`modelpress pipeline`), or
an .npz of arrays named after the model's inputs (then -o may be an .npz of outputs).

A run that is stopped (Ctrl-C, a crash, SIGKILL) continues where it stopped when the same command
is run again: its progress is kept in OUT.mp-journal until OUT is written whole.

examples:
  modelpress run model.onnx images/ -o predictions.jsonl --workers auto --batch-size 16
  modelpress run encoder.onnx texts.jsonl -o embeddings.jsonl
  modelpress run model.onnx inputs.npz -o outputs.npz --batch-size 4
  modelpress run model.onnx images/ -o predictions.jsonl --ray            # local Ray cluster
"""


def add_parser(sub) -> None:
    p = options.add_command(
        sub,
        "run",
        __doc__,
        help="run a model over a folder of images, a .jsonl of texts or an .npz (batch inference)",
        epilog=EPILOG,
    )
    add_model(p)
    p.add_argument("data_pos", nargs="?", metavar="DATA", help="a folder, a .jsonl or an .npz")
    p.add_argument(
        "--data", metavar="DATA", help="DATA given as an option (the same as the positional DATA)"
    )
    p.add_argument(
        "--inputs", dest="data", help=argparse.SUPPRESS
    )  # the old name, kept for a release
    add_output(p, help="predictions: a .jsonl file (an .npz for .npz data)")
    p.add_argument(
        "--batch-size",
        type=int,
        metavar="N",
        help="items per model run (default 8; an .npz runs whole)",
    )
    p.add_argument(
        "--workers",
        default="auto",
        metavar="N|auto",
        help="pre-processing worker processes (default auto: one per CPU; 0: none, inline)",
    )
    p.add_argument(
        "--prefetch",
        type=int,
        metavar="N",
        help="prepared batches kept ready (default 2 per worker)",
    )
    options.add_switch(p, "--restart", "start over instead of resuming a stopped run")
    options.add_ray(p, on="run on Ray Data", replicas="model replicas (actors) on Ray (default 1)")
    p.add_argument(
        "--labels-key",
        metavar="KEY",
        help="an array of the .npz to leave out, as labels (default: one named 'labels')",
    )
    options.add_batching(p)
    options.add_switch(p, "--quiet", "no progress bar")
    add_device(p)
    add_key(p)
    add_record(p)
    p.set_defaults(func=run)


def run(args) -> int:

    if args.data_pos and args.data and args.data_pos != args.data:
        raise OptionError("give DATA once (as DATA or --data)")
    data = args.data_pos or args.data
    if not data:
        raise OptionError("DATA: give a folder of images, a .jsonl of texts or an .npz of inputs")
    require_positive(args.batch_size, "--batch-size")
    require_positive(args.prefetch, "--prefetch")
    require_positive(args.replicas, "--replicas")
    workers = args.workers
    if workers != "auto":
        if not str(workers).isdigit():
            raise OptionError(f"--workers {workers}: expected a number or auto")
        workers = int(workers)
    refuse_overwrite(args.output, args.model, data)  # before anything is read or written
    recorder = Recorder("run", args)
    model = open_model(args.model, args)
    with _progress(args.quiet) as progress:
        result = run_batch(
            model,
            data,
            **options.keywords(
                args, "output", "batch_size", "prefetch", "restart", "ray", "labels_key"
            ),
            **options.placement(args),
            workers=workers,
            ray_actors=args.replicas,
            rule=options.batching_rule(args)(model),
            source_file=args.model,
            progress=progress,
        )
    for w in result.warnings:
        err_console.print(f"warning: {w}")
    if args.log_placement:
        for line in result.placement:
            console.print(line)
    if result.note:
        err_console.print(f"note: {result.note}")
    resumed = f", {result.resumed} done before" if result.resumed else ""
    errors = f", {result.errors} unreadable (an error line each)" if result.errors else ""
    console.print(
        f"wrote {result.output}: {result.items} item(s){resumed}{errors}; "
        f"{result.written} run in {result.elapsed_s:.1f} s ({result.items_per_s:.1f} items/s, "
        f"batch {result.batch_size}, {result.workers} worker(s), device {result.device})"
    )
    console.print(
        f"model busy {result.busy_s:.1f} s ({100 * result.busy_fraction:.0f}%), "
        f"waited for input {result.wait_s:.1f} s, writing {result.emit_s:.1f} s"
    )
    recorder.write(result.to_dict())
    return 0


class _progress:
    """A rich progress bar on stderr (items/s), as the callback ``run_batch`` calls."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.bar = None
        self.task = None

    def __enter__(self):
        if self.quiet:
            return None
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TaskProgressColumn,
            TextColumn,
            TimeRemainingColumn,
        )

        self.bar = transient_bar(
            TextColumn("run"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeRemainingColumn(),
            to=err_console,
        )
        self.bar.start()
        self.task = self.bar.add_task("run", total=None, rate="")
        self.first: tuple[float, int] | None = None
        return self.update

    def update(self, done: int, total: int) -> None:
        import time

        now = time.perf_counter()
        if self.first is None:
            self.first = (now, done)
        t0, d0 = self.first
        rate = f"{(done - d0) / (now - t0):.1f} items/s" if now > t0 and done > d0 else ""
        self.bar.update(self.task, completed=done, total=total, rate=rate)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
