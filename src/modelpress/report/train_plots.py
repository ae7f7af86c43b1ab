"""The loss curve of a command that trained (prune, distill, compress, quantize --mode qat), for
the HTML report (matplotlib, the ``report`` extra).

``loss_curve(result)`` reads the ``training`` entry of a record's result (one run, or a list of
runs: iterative pruning, Deep Compression's two retrainings, one after the other on one step
axis) and draws the train loss per interval and the held-out loss; None when nothing trained.
"""

from __future__ import annotations

from modelpress.report.html import new_figure


def _runs(result: dict) -> list[dict]:
    training = result.get("training")
    if not training:
        return []
    return training if isinstance(training, list) else [training]


def loss_curve(result: dict):
    runs = [r for r in _runs(result) if r and (r.get("curve") or r.get("val"))]
    if not runs:
        return None
    fig, ax = new_figure()
    offset = 0
    for i, run in enumerate(runs):
        label = f" ({i + 1})" if len(runs) > 1 else ""
        curve, val = run.get("curve") or [], run.get("val") or []
        if curve:
            ax.plot(
                [offset + p["step"] for p in curve],
                [p["loss"] for p in curve],
                color="C0",
                label="train" + label if i == 0 else None,
            )
        if val:
            ax.plot(
                [offset + p["step"] for p in val],
                [p["loss"] for p in val],
                "o--",
                color="C1",
                label="held out" if i == 0 else None,
            )
        offset += run.get("steps") or (curve[-1]["step"] if curve else 0)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    ax.legend()
    return fig
