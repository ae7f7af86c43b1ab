"""Recommendations: ranking with reasons, costs by hand, and clear errors for impossible requests."""

from __future__ import annotations

import pytest

from modelpress.advisor.catalog import load_catalog
from modelpress.advisor.cost import Pricing, cost_of, hourly_rates
from modelpress.advisor.recommend import NoViableDeviceError, Request, recommend
from modelpress.errors import ModelpressError, OptionError
from modelpress.profile import get_workload


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_owned_and_cloud_rates_by_hand(catalog):
    a100 = catalog.find("A100 SXM4 80GB")  # 16250 USD, 400 W, 1.89 USD/h
    pricing = Pricing(life_years=4, electricity_usd_kwh=0.2, utilization=0.5)
    cloud, own = hourly_rates(a100, 2, pricing)
    assert cloud == pytest.approx(2 * 1.89)
    assert own == pytest.approx(2 * (16250 / (4 * 8760 * 0.5) + 0.4 * 0.2))
    cost = cost_of(a100, 2, throughput=1000.0, pricing=pricing, amount=7.2e6)
    assert cost.cloud_usd_per_million == pytest.approx(2 * 1.89 / 3.6)
    assert cost.job_hours == pytest.approx(2.0)
    assert cost.cloud_job_usd == pytest.approx(4 * 1.89)
    assert cost_of(catalog.find("T4"), 1, throughput=1.0, pricing=pricing).best_per_million is None
    with pytest.raises(OptionError):
        Pricing(utilization=0)


def test_online_ranking_is_by_cost_with_reasons(catalog):
    gpus = [catalog.find(n) for n in ("A100 SXM4 80GB", "H100 SXM", "L4", "RTX 4090", "T4")]
    rec = recommend(
        get_workload("resnet50"), gpus, Request(task="infer", precision="int8", latency_ms=5)
    )
    assert rec.scenario == "online"
    ranked = rec.ranked
    assert [r.rank for r in ranked] == list(range(1, len(ranked) + 1))
    prices = [r.cost.best_per_million for r in ranked if r.cost.best_per_million is not None]
    assert prices == sorted(prices)
    for r in ranked:
        assert r.estimate.latency_ms <= 5 and r.estimate.fits
        assert "bound at batch" in r.reason
    assert ranked[0].reason.startswith("cheapest")
    assert (
        rec.rows[-1].gpu.name == "NVIDIA T4" and "no price" in rec.rows[-1].reason
    )  # unpriced last


def test_latency_nobody_meets(catalog):
    gpus = [catalog.find(n) for n in ("L4", "T4")]
    with pytest.raises(
        NoViableDeviceError,
        match=r"no device meets --latency-ms 0.01; the fastest, NVIDIA (L4|T4), needs [0-9.]+ ms at batch 1",
    ):
        recommend(
            get_workload("resnet50"), gpus, Request(task="infer", precision="fp16", latency_ms=0.01)
        )


def test_model_that_fits_nowhere(catalog):
    with pytest.raises(NoViableDeviceError) as err:
        recommend(
            get_workload("llama-2-70b"), list(catalog.gpus), Request(task="train", precision="bf16")
        )
    msg = str(err.value)
    assert isinstance(err.value, ModelpressError)
    assert "fits on none of the" in msg and "largest has 192 GB" in msg and "--num-gpus" in msg


def test_edge_power_cap(catalog):
    rec = recommend(
        get_workload("mobilenet-v2"),
        list(catalog.gpus),
        Request(task="infer", precision="int8", power_cap_w=75, batch=8),
    )
    assert rec.scenario == "edge"
    assert {r.gpu.name for r in rec.ranked} == {"NVIDIA L4", "NVIDIA T4"}
    thr = [r.estimate.throughput for r in rec.ranked]
    assert thr == sorted(thr, reverse=True)
    assert any("over the 75 W cap" in r.reason for r in rec.rows)
    with pytest.raises(NoViableDeviceError, match="within the 10 W power cap"):
        recommend(
            get_workload("mobilenet-v2"),
            list(catalog.gpus),
            Request(task="infer", precision="int8", power_cap_w=10),
        )


def test_training_job_cost(catalog):
    gpus = [catalog.find(n) for n in ("A100 SXM4 80GB", "H100 SXM")]
    rec = recommend(
        get_workload("bert-base"),
        gpus,
        Request(task="train", precision="bf16", batch=32, amount=1e7),
    )
    for r in rec.ranked:
        assert r.cost.job_hours == pytest.approx(1e7 / r.estimate.throughput / 3600)
    jobs = [r.cost.best_job_usd for r in rec.ranked]
    assert jobs == sorted(jobs)
