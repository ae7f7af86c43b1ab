"""What the commands that train share: the progress bar (the stage, the step and the running
loss), the summary of the training and of the check, and the budget the result is held to."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from modelpress.cli import options
from modelpress.cli._common import console, refuse_unless_kept, transient_bar
from modelpress.ir.files import output_dir


@contextmanager
def training_bar() -> Iterator:
    """``progress(stage, step, total, loss)`` for the library functions, drawn as a rich bar."""
    with transient_bar(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
    ) as bar:
        tasks: dict[str, int] = {}

        def progress(stage: str, step: int, total: int, loss: float | None) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total or None, loss="-")
            shown = f"{loss:.4g}" if loss is not None else "-"
            bar.update(tasks[stage], completed=step, total=total or None, loss=shown)

        yield progress


@contextmanager
def training_run(command: str, args) -> Iterator:
    """The start of a command that trains: the output's folder checked and the record begun before
    any work, the model opened, the progress bar shown; yields ``(recorder, model, progress)``."""
    output_dir(args.output)
    recorder = options.Recorder(command, args)
    model = options.open_model(args.model, args)
    with training_bar() as progress:
        yield recorder, model, progress


def print_training(results) -> None:
    for i, t in enumerate(results):
        where = f" ({i + 1}/{len(results)})" if len(results) > 1 else ""
        loss = (
            f"loss {t.first_loss:.4g} → {t.final_loss:.4g}"
            if t.first_loss is not None and t.final_loss is not None
            else "no loss measured"
        )
        stop = ", stopped early" if t.stopped_early else ""
        console.print(
            f"training{where}: {t.steps} steps on {t.samples} samples, {loss} (held out: {t.held_out}){stop}, {t.seconds:.1f} s"
        )
        if t.fell_back:
            console.print(
                f"note: training{where} made the model worse as ONNX Runtime runs it on the "
                f"held-out samples ({t.score_before:.4g} → {t.score_after:.4g}): the model before "
                "it is kept (try a lower --lr or more data)"
            )


def print_check(check) -> None:
    if check is None:
        return
    parts = []
    if check.accuracy_before is not None:
        parts.append(f"accuracy {check.accuracy_before:.2%} → {check.accuracy_after:.2%}")
    if check.agreement is not None:
        parts.append(f"top-1 agreement {check.agreement:.2%}")
    if check.cosine is not None:
        parts.append(f"cosine {check.cosine:.4f}")
    console.print(f"check on {check.samples} held-out samples: " + ", ".join(parts))


def enforce_budget(args, check, record: dict, recorder) -> dict:
    """The record with the budget's verdict; ``VerificationError`` (after writing the record, not
    the model) when the result is outside the budget and --keep-anyway was not given."""
    budget = options.budget(args)
    failures = budget.failures(check)
    record = {**record, "budget": {**budget.to_dict(), "failures": failures}}
    if check is None:
        console.print("note: no held-out samples to check the result on (give --data)")
    refuse_unless_kept(args, failures, record, recorder)
    if failures:
        console.print(f"[yellow]outside the budget[/] ({'; '.join(failures)}): written anyway")
    return record


def write_checked(args, result, trainings, record: dict, recorder, write) -> int:
    """Print the training and the check of ``result``, hold it to the budget (``enforce_budget``),
    then write it (``write()``) and the command's record."""
    print_training(trainings)
    print_check(result.check)
    record = enforce_budget(args, result.check, record, recorder)
    write()
    console.print(f"wrote {args.output}")
    recorder.write({**record, "written": args.output})
    return 0
