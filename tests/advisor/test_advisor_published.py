"""The default factors against the published measurements they were fitted on (a regression guard:
the accuracy target is a median error under 25% and nothing off by more than 2x)."""

from __future__ import annotations

import statistics

from modelpress.advisor.catalog import load_catalog
from modelpress.advisor.efficiency import DEFAULT_EFFICIENCY
from modelpress.advisor.published import load_published, predict


def test_rows_are_placed_and_unknown_devices_skipped():
    rows, skipped = load_published(load_catalog())
    assert len(rows) == 42
    assert len(skipped) == 3 and all("not in the catalog" in s for s in skipped)
    assert {r.model for r in rows} == {"resnet50", "bert-large", "gemm"}


def test_default_factors_meet_the_accuracy_target_on_training_rows():
    catalog = load_catalog()
    rows, _ = load_published(catalog)
    ratios = [
        predict(r, catalog, DEFAULT_EFFICIENCY) / r.measured for r in rows if r.model != "gemm"
    ]
    assert statistics.median(abs(q - 1) for q in ratios) < 0.25
    assert max(max(q, 1 / q) for q in ratios) < 2.0
