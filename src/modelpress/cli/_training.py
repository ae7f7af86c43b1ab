"""The progress bar of commands that train: the stage, the step and the running loss."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from modelpress.cli._common import console


@contextmanager
def training_bar() -> Iterator:
    """``progress(stage, step, total, loss)`` for the library functions, drawn as a rich bar."""
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        tasks: dict[str, int] = {}

        def progress(stage: str, step: int, total: int, loss: float | None) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total or None, loss="-")
            shown = f"{loss:.4g}" if loss is not None else "-"
            bar.update(tasks[stage], completed=step, total=total or None, loss=shown)

        yield progress


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
