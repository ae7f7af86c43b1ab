"""Wave (tile) quantisation: the utilisation formula by hand, its effect on an estimate, and the
SM counts in the catalog."""

from __future__ import annotations

import csv
from dataclasses import replace
from importlib import resources

import pytest

from modelpress.advisor.catalog import load_catalog
from modelpress.advisor.efficiency import Efficiency
from modelpress.advisor.estimate import estimate
from modelpress.advisor.waves import (
    SPLIT_K_MIN_DEPTH,
    TILE_EFFICIENCY,
    gemm_utilisation,
    output_tiles,
    split_k,
    wave_utilisation,
)
from modelpress.profile import get_workload
from modelpress.profile.workload import Kernel, Workload

EFF = Efficiency(gemm_ceiling=0.8, matmul=0.5, bandwidth=0.5, kernel_overhead_us=10.0)


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


@pytest.mark.parametrize(
    "tiles,sms,expected",
    [
        (108, 108, 1.0),
        (109, 108, 109 / 216),
        (24, 108, 24 / 108),
        (1, 108, 1 / 108),
        (216, 108, 1.0),
        (4096, 108, 4096 / (38 * 108)),
        (7, 1, 1.0),
    ],
)
def test_wave_utilisation_by_hand(tiles, sms, expected):
    assert wave_utilisation(tiles, sms) == pytest.approx(expected, rel=1e-15)


def test_wave_utilisation_rejects_empty_input():
    with pytest.raises(ValueError):
        wave_utilisation(0, 108)


def test_output_tiles_by_hand():
    # BERT-Large output projection at batch 1: 384 x 1024
    assert output_tiles(384 * 1024, 1024, tile=128) == 3 * 8
    assert output_tiles(384 * 1024, 1024, tile=64) == 6 * 16
    # partial tiles count whole: 100 x 200 is 1 x 2 tiles of 128, 2 x 4 of 64
    assert output_tiles(100 * 200, 200, tile=128) == 2
    assert output_tiles(100 * 200, 200, tile=64) == 8
    # the library picks the tile that does the most work per unit of time: 96 tiles of 64² at
    # half an SM's rate (48/108) beat 24 of 128² (24/108)
    assert TILE_EFFICIENCY == {128: 1.0, 64: 0.5}
    assert gemm_utilisation(384 * 1024, 1024, 108) == pytest.approx(48 / 108, rel=1e-15)
    # a tie keeps the same value whichever tile: 8192² is 4096 tiles of 128², 16384 of 64²
    assert gemm_utilisation(8192 * 8192, 8192, 108) == pytest.approx(4096 / 4104, rel=1e-15)


def test_split_k_by_hand():
    assert SPLIT_K_MIN_DEPTH == 256
    # BERT-Base FFN output at batch 1, sequence 128: 128 x 768, K = 3072. 24 tiles of 64² take
    # 4 slices (they fill the wave; 12 of 256 would be possible): 96 of 108 SMs at half rate;
    # 6 tiles of 128² take 12 slices: 72 of 108 at full rate, the better
    assert split_k(24, 3072, 108) == 4
    assert split_k(6, 3072, 108) == 12
    assert gemm_utilisation(128 * 768, 768, 108, depth=3072) == pytest.approx(72 / 108)
    # K = 768: 3 slices of 256 at most -> 18 of 108 SMs (128²) or 72 at half rate (64²)
    assert split_k(24, 768, 108) == 3
    assert gemm_utilisation(128 * 768, 768, 108, depth=768) == pytest.approx(36 / 108)
    # a shallow reduction (a slice would be under 256 deep) or a full wave: no split
    assert split_k(24, 511, 108) == 1
    assert split_k(108, 1 << 20, 108) == 1
    assert split_k(200, 1 << 20, 108) == 1
    # unknown depth (0): no split, the plain wave model (24 tiles of 64² at half rate)
    assert gemm_utilisation(128 * 768, 768, 108) == pytest.approx(12 / 108)


def _gemm(m: int, n: int, k: int) -> Workload:
    """One M x K by K x N product per sample (weights excluded so it stays compute-bound)."""
    return Workload(
        "gemm",
        (Kernel("mm", "matmul", 2.0 * m * n * k, 0.0, m * k, m * n, out_cols=n),),
        params=0.0,
        sample="row",
    )


def _compute_s(est, eff: Efficiency = EFF) -> float:
    return est.latency_ms / 1e3 - eff.kernel_overhead_us * 1e-6


@pytest.mark.parametrize(
    "m,n,k,slowdown",
    [
        # 384 x 1024, K = 1024: 24 tiles of 128², 4 slices each -> 96 of 108 SMs
        (384, 1024, 1024, 108 / 96),
        # 128 x 768, K = 3072: 6 tiles of 128², 12 slices each -> 72 of 108 SMs (not 6)
        (128, 768, 3072, 108 / 72),
        # 8192²: 4096 tiles of 128² in 38 waves of 108
        (8192, 8192, 8192, 4104 / 4096),
    ],
)
def test_gemm_time_is_the_roofline_over_the_wave_utilisation(catalog, m, n, k, slowdown):
    a100 = catalog.find("A100 SXM4 40GB")
    assert a100.sm_count == 108
    w = _gemm(m, n, k)
    with_waves = estimate(w, a100, task="infer", precision="fp16", batch=1, eff=EFF)
    plain = estimate(
        w, replace(a100, sm_count=None), task="infer", precision="fp16", batch=1, eff=EFF
    )
    expected = 2.0 * m * n * k / (312e12 * 0.8 * 0.5)
    assert _compute_s(plain) == pytest.approx(expected, rel=1e-9)
    assert _compute_s(with_waves) == pytest.approx(expected * slowdown, rel=1e-9)


def test_large_batch_bert_is_unaffected(catalog):
    a100 = catalog.find("A100 SXM4 40GB")
    bert = get_workload("bert-large", seq=384)
    a = estimate(bert, a100, task="infer", precision="fp16", batch=128)
    b = estimate(bert, replace(a100, sm_count=None), task="infer", precision="fp16", batch=128)
    assert 0.99 < a.throughput / b.throughput <= 1.0


def test_batch_one_bert_is_slower_and_unknown_shapes_are_untouched(catalog):
    a100 = catalog.find("A100 SXM4 40GB")
    bert = get_workload("bert-large", seq=384)
    eff = Efficiency(kernel_overhead_us=0.0)  # compare the kernels' own time
    a = estimate(bert, a100, task="infer", precision="int8", batch=1, eff=eff)
    b = estimate(
        bert, replace(a100, sm_count=None), task="infer", precision="int8", batch=1, eff=eff
    )
    # the 1024-wide products fill 96 of 108 SMs (64² tiles): compute time x 108/96
    assert a.latency_ms > 1.06 * b.latency_ms
    # a kernel without a known output width (e.g. a hand-made one) keeps the plain roofline
    w = Workload("k", (Kernel("mm", "matmul", 1e9, 0.0, 1e3, 1e3),), params=0.0, sample="row")
    x = estimate(w, a100, task="infer", precision="fp16", batch=1, eff=EFF)
    y = estimate(w, replace(a100, sm_count=None), task="infer", precision="fp16", batch=1, eff=EFF)
    assert x.latency_ms == y.latency_ms


def test_sm_counts_in_the_catalog_have_sources(catalog):
    text = resources.files("modelpress.advisor").joinpath("data/gpus.csv").read_text()
    rows = list(csv.DictReader(text.splitlines()))
    with_sm = [r for r in rows if r["sm_count"].strip()]
    assert len(with_sm) >= 15
    for row in with_sm:
        assert row["src_sm"].strip(), f"{row['name']}: sm_count without src_sm"
        assert float(row["sm_count"]).is_integer() and float(row["sm_count"]) > 0
    assert catalog.find("H100 SXM").sm_count == 132
    assert catalog.find("H100 PCIe").sm_count == 114
    assert catalog.find("A100 SXM4 80GB").sm_count == 108
    # TPUs have no SMs: the wave model is off for them
    assert catalog.find("TPU v4").sm_count is None
