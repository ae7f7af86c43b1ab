"""The report draws the loss curve that every training record holds (prune, distill, compress,
quantize --mode qat write it under ``training``), and point labels in the cost and Pareto charts
never cover one another. Before: no loss curve for any of them; labels of near devices stacked."""

from __future__ import annotations

import pytest

from modelpress.report.html import label_points, new_figure
from modelpress.report.page import build_page
from modelpress.report.record import Record


def _run(steps: int, start: float) -> dict:
    curve = [{"step": s, "loss": start / (1 + s)} for s in range(1, steps + 1)]
    val = [{"step": s, "loss": 1.1 * start / (1 + s)} for s in range(0, steps + 1, 2)]
    return {"steps": steps, "curve": curve, "val": val}


@pytest.mark.parametrize(
    ("command", "training"),
    [
        ("prune", [_run(6, 2.0), _run(4, 1.0)]),  # iterative pruning: a list of runs
        ("distill", _run(8, 3.0)),
        ("compress", [_run(5, 1.5), _run(5, 0.7)]),
        ("quantize", _run(4, 0.5)),  # --mode qat
    ],
)
def test_every_training_record_gets_its_loss_curve(command, training):
    text = build_page([Record(command=command, result={"training": training})]).render()
    # before: no figure at all for these records
    assert "training loss per optimizer step" in text and text.count("<svg") >= 1
    untrained = build_page([Record(command=command, result={"training": []})]).render()
    assert "training loss per optimizer step" not in untrained


def test_labels_of_crowded_points_never_overlap():
    fig, ax = new_figure()
    points = [(1.0 + 0.01 * i, 100.0 + 0.5 * i, f"device number {i}") for i in range(12)]
    ax.scatter([p[0] for p in points], [p[1] for p in points])
    ax.set_xlim(0.5, 2.0)
    ax.set_ylim(50, 200)
    left_out = label_points(ax, points)
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(boxes) + left_out == len(points) and len(boxes) >= 4
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b)
    # far-apart points all keep their labels
    fig, ax = new_figure()
    spread = [(1.0, 1.0, "a"), (5.0, 5.0, "b"), (9.0, 9.0, "c")]
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10)
    assert label_points(ax, spread) == 0 and len(ax.texts) == 3
