"""The loss curve figure drawn from a record's training entry."""

from __future__ import annotations

from modelpress.report.train_plots import loss_curve


def test_loss_curve_from_record():
    run = {
        "steps": 4,
        "curve": [{"step": 2, "loss": 1.0}, {"step": 4, "loss": 0.5}],
        "val": [{"step": 0, "loss": 1.2}, {"step": 4, "loss": 0.6}],
    }
    fig = loss_curve({"training": [run, run]})
    lines = fig.axes[0].get_lines()
    # two runs on one step axis: the second starts where the first ended
    assert [list(line.get_xdata()) for line in lines] == [[2, 4], [0, 4], [6, 8], [4, 8]]
    assert loss_curve({"training": None}) is None and loss_curve({}) is None
