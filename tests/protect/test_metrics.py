"""The metrics' building blocks against hand-computed answers: the name search finds every
occurrence wherever it sits in the bytes, the label-free histogram distance, the correlation."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from modelpress.protect.correlation import max_correlation
from modelpress.protect.metrics import histogram_distance, names_in


def test_names_are_found_anywhere_and_only_where_they_are():
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, 3_000_000, dtype=np.uint8).tobytes()
    data = (
        b"start_name"
        + noise[:1_000_000]
        + b"\x00mid.layer/weight\x00"
        + noise[1_000_000:]
        + b"end_name"
    )
    names = [
        "start_name",
        "mid.layer/weight",
        "layer",
        "end_name",
        "absent_name",
        "dl_kg\x01",
        "nom_é_accent",
    ]
    found = names_in(data, names)
    assert found == ["start_name", "mid.layer/weight", "layer", "end_name"]
    assert names_in(b"abcdefgh", ["bcdef", "cdefgh", "abcdefghi"]) == ["bcdef", "cdefgh"]
    assert names_in(b"", ["hello"]) == [] and names_in(b"hello", ["hello"]) == ["hello"]
    assert names_in("xx nom_é_accent".encode(), ["nom_é_accent"]) == ["nom_é_accent"]


def test_the_histogram_distance_credits_the_best_matching():
    original = Counter({"Conv": 6, "Relu": 3, "Add": 1})
    assert histogram_distance(original, Counter({"a": 6, "b": 3, "c": 1})) == pytest.approx(
        0.0
    )  # renaming alone hides nothing
    flat = Counter({f"t{i}": 1 for i in range(10)})
    # sorted profiles (.6, .3, .1) vs ten times .1: half the sum of |differences|
    assert histogram_distance(original, flat) == pytest.approx(0.5 * (0.5 + 0.2 + 0.0 + 7 * 0.1))


def test_correlation_over_same_size_pairs():
    rng = np.random.default_rng(1)
    w = rng.standard_normal(4096)
    stored = [w * 3 + 1, rng.standard_normal(4096), rng.standard_normal(100)]
    corr, pairs = max_correlation(
        stored, [w, np.ones(4096)]
    )  # a constant weight has no correlation
    assert corr == pytest.approx(1.0) and pairs == 2
    corr, pairs = max_correlation(stored[1:], [w])
    assert corr < 0.1 and pairs == 1
