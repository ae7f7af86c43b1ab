"""The estimator: the roofline formula on a hand-made kernel, monotonic sanity, fit and batch search."""

from __future__ import annotations

from dataclasses import replace

import pytest

from modelpress.advisor.catalog import load_catalog
from modelpress.advisor.efficiency import Efficiency
from modelpress.advisor.estimate import best_under_latency, estimate, max_batch, time_to_train
from modelpress.profile import get_workload
from modelpress.profile.workload import Kernel, Workload

EFF = Efficiency(gemm_ceiling=0.8, matmul=0.5, bandwidth=0.5, kernel_overhead_us=10.0)


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def _one_kernel(flops, weights, acts):
    return Workload(
        "k", (Kernel("mm", "matmul", flops, weights, acts, 0.0),), params=weights, sample="row"
    )


def test_roofline_formula(catalog):
    a100 = catalog.find("A100 SXM4 40GB")  # 312 TFLOPS fp16, 1555 GB/s, no measured ceiling
    compute_bound = _one_kernel(flops=1e9, weights=1e3, acts=1e3)
    e = estimate(compute_bound, a100, task="infer", precision="fp16", batch=100, eff=EFF)
    expected = 100 * 1e9 / (312e12 * 0.8 * 0.5) + 10e-6
    assert e.latency_ms == pytest.approx(expected * 1e3, rel=1e-12)
    assert e.throughput == pytest.approx(100 / expected, rel=1e-12)
    assert e.bound == "compute"
    memory_bound = _one_kernel(flops=10.0, weights=1e8, acts=1e3)
    e = estimate(memory_bound, a100, task="infer", precision="fp16", batch=4, eff=EFF)
    # the 8 KB of activations stay in the A100's 40 MB L2: only the weights come from DRAM
    expected = 1e8 * 2 / (1555e9 * 0.5) + 10e-6
    assert e.latency_ms == pytest.approx(expected * 1e3, rel=1e-12)
    assert e.bound == "memory"
    tiny = _one_kernel(flops=10.0, weights=10, acts=10)
    assert (
        estimate(tiny, a100, task="infer", precision="fp16", batch=1, eff=EFF).bound == "overhead"
    )


def test_a_gather_reads_the_rows_it_writes(catalog):
    a100 = catalog.find("A100 SXM4 40GB")
    no_l2 = replace(a100, l2_mb=None)
    # an embedding table of 30522 x 768, 128 tokens looked up per sample
    table, rows = 30522 * 768, 128 * 768
    w = Workload(
        "emb", (Kernel("emb", "memory", 0.0, table, 128, rows),), params=table, sample="row"
    )
    e = estimate(w, no_l2, task="infer", precision="fp16", batch=2, eff=EFF)
    # 2 samples read 2 x 128 rows of the table and read/write their ids and outputs
    expected = (2 * rows * 2 + 2 * (128 + rows) * 2) / (1555e9 * 0.5) + 10e-6
    assert e.latency_ms == pytest.approx(expected * 1e3, rel=1e-12)
    # a batch that touches more rows than the table holds reads the table once
    big = estimate(w, no_l2, task="infer", precision="fp16", batch=1000, eff=EFF)
    expected = (table * 2 + 1000 * (128 + rows) * 2) / (1555e9 * 0.5) + 10e-6
    assert big.latency_ms == pytest.approx(expected * 1e3, rel=1e-12)


@pytest.mark.parametrize(
    "workload,task",
    [("resnet50", "train"), ("resnet50", "infer"), ("bert-base", "infer"), ("llama-2-7b", "infer")],
)
def test_more_bandwidth_or_compute_is_never_slower(catalog, workload, task):
    w = get_workload(workload, gen_tokens=16)
    gpu = catalog.find("A100 SXM4 80GB")
    base = estimate(w, gpu, task=task, precision="fp16", batch=8)
    faster_memory = estimate(
        w,
        replace(gpu, memory_bandwidth_gbs=gpu.memory_bandwidth_gbs * 2),
        task=task,
        precision="fp16",
        batch=8,
    )
    faster_compute = estimate(
        w,
        replace(
            gpu, fp16_tflops=gpu.fp16_tflops * 2, matmul_bf16_tflops_measured=None, bf16_tflops=None
        ),
        task=task,
        precision="fp16",
        batch=8,
    )
    assert faster_memory.throughput >= base.throughput
    assert (
        faster_compute.throughput >= base.throughput * 0.999
    )  # the measured ceiling was dropped too


def test_bigger_batch_more_throughput_more_latency(catalog):
    w = get_workload("resnet50")
    gpu = catalog.find("L4")
    runs = [estimate(w, gpu, task="infer", precision="int8", batch=b) for b in (1, 2, 8, 32, 64)]
    assert all(a.latency_ms <= b.latency_ms for a, b in zip(runs[:-1], runs[1:], strict=True))
    assert runs[0].bound == "overhead" or runs[0].latency_ms < 1
    # throughput rises while a batch's activations stay in the L4's 48 MB L2 (to batch 32, the
    # batch MLPerf submits on the L4); past it they spill to its 300 GB/s DRAM and it falls back
    assert all(a.throughput <= b.throughput for a, b in zip(runs[:3], runs[1:4], strict=True))
    assert runs[4].throughput < runs[3].throughput


def test_max_batch_is_the_edge_of_fitting(catalog):
    w = get_workload("bert-large", seq=384)
    gpu = catalog.find("V100 SXM2 16GB")
    b = max_batch(w, gpu, task="train", precision="fp16")
    assert b > 0
    assert estimate(w, gpu, task="train", precision="fp16", batch=b).fits
    assert not estimate(w, gpu, task="train", precision="fp16", batch=b + 1).fits
    big = get_workload("llama-2-70b")
    assert max_batch(big, gpu, task="train", precision="fp16") == 0


def test_training_memory_includes_16_bytes_per_parameter(catalog):
    w = get_workload("bert-large", seq=128)
    e = estimate(w, catalog.find("H100 SXM"), task="train", precision="fp16", batch=1)
    assert e.memory_gb > 16 * w.params / 1e9


def test_best_under_latency(catalog):
    w = get_workload("resnet50")
    gpu = catalog.find("T4")
    best = best_under_latency(w, gpu, latency_ms=10, precision="int8")
    assert best.latency_ms <= 10
    assert estimate(w, gpu, task="infer", precision="int8", batch=best.batch + 1).latency_ms > 10
    assert best_under_latency(w, gpu, latency_ms=0.01, precision="int8") is None


def test_data_parallel_training(catalog):
    w = get_workload("bert-large", seq=128)
    gpu = catalog.find("A100 SXM4 80GB")
    one = estimate(w, gpu, task="train", precision="fp16", batch=32)
    eight = estimate(w, gpu, task="train", precision="fp16", batch=32, num_gpus=8)
    # ring all-reduce of the fp16 gradients over NVLink (300 GB/s per direction) at 85% efficiency
    expected_comm = 2 * 7 / 8 * w.params * 2 / (300e9 * 0.85) + 10e-6
    assert eight.comm_ms == pytest.approx(expected_comm * 1e3, rel=1e-9)
    assert one.throughput < eight.throughput <= 8 * one.throughput
    assert "over NVLink" in " ".join(eight.notes)
    # PCIe cards bridge NVLink in pairs only: eight of them all-reduce over PCIe (32 GB/s per direction)
    pcie = estimate(
        w, catalog.find("A100 PCIe 80GB"), task="train", precision="fp16", batch=32, num_gpus=8
    )
    assert "over PCIe" in " ".join(pcie.notes)
    assert pcie.comm_ms == pytest.approx(
        (2 * 7 / 8 * w.params * 2 / (32e9 * 0.85) + 10e-6) * 1e3, rel=1e-9
    )
    assert time_to_train(eight, 1e6) == pytest.approx(1e6 / eight.throughput)


def test_tensor_parallel_when_the_model_does_not_fit_one(catalog):
    w = get_workload("llama-2-70b", gen_tokens=32)
    gpu = catalog.find("H100 SXM")
    one = estimate(w, gpu, task="infer", precision="fp16", batch=1)
    assert not one.fits
    two = estimate(w, gpu, task="infer", precision="fp16", batch=1, num_gpus=2)
    assert two.fits and "tensor parallel" in " ".join(two.notes)


def test_precision_fallback_is_reported(catalog):
    e = estimate(
        get_workload("resnet50"),
        catalog.find("A100 SXM4 80GB"),
        task="infer",
        precision="fp8",
        batch=8,
    )
    assert e.precision_used == "fp16"
    assert "no fp8 units" in e.notes[0]
