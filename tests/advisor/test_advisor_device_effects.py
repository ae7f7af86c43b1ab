"""What a card does under load, by hand: sustained clocks of power-limited cards, activations
kept in the L2 cache, 8-bit work on cards whose 8-bit units are slower, eager inference, fused
attention."""

from __future__ import annotations

from dataclasses import replace

import pytest

from modelpress.advisor.catalog import load_catalog
from modelpress.advisor.clocks import sustained_clock
from modelpress.advisor.efficiency import Efficiency
from modelpress.advisor.estimate import estimate, roof_for
from modelpress.advisor.launches import fuses_attention, launches
from modelpress.profile import get_workload
from modelpress.profile.workload import Kernel, Workload

EFF = Efficiency(gemm_ceiling=0.8, matmul=0.5, bandwidth=0.5, kernel_overhead_us=10.0)


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_sustained_clock_by_hand(catalog):
    t4 = catalog.find("T4")  # 70 W, base 585 MHz, boost 1590 MHz (src_clock)
    assert (t4.base_clock_mhz, t4.boost_clock_mhz) == (585, 1590) and t4.source("base_clock_mhz")
    full = sustained_clock(t4, 1.4, activity=1.0)
    assert full.fraction == pytest.approx(1.4 * 585 / 1590) and full.mhz == pytest.approx(819)
    assert "power-limited (70 W)" in full.note
    # a load busy half the time draws half the power: the clock may rise by 2^(1/3)
    half = sustained_clock(t4, 1.4, activity=0.5)
    assert half.fraction == pytest.approx(2 ** (1 / 3) * 1.4 * 585 / 1590)
    assert sustained_clock(t4, 1.4, activity=0.05).fraction == 1.0  # capped at boost
    assert sustained_clock(t4, 1.4, activity=0.0).fraction == 1.0
    # a 400 W A100 SXM4 holds its boost clock; a card without clock data is taken to hold it
    assert sustained_clock(catalog.find("A100 SXM4 40GB"), 1.4).fraction == 1.0
    assert sustained_clock(catalog.find("TPU v4"), 1.4).fraction == 1.0


def test_power_limited_roof_and_measured_ceilings(catalog):
    t4 = catalog.find("T4")
    roof = roof_for(t4, "int8", EFF, activity=1.0)
    frac = EFF.clock_headroom * 585 / 1590
    assert roof.tensor_tflops == pytest.approx(130 * frac)
    assert roof.vector_tflops == pytest.approx(8.1 * frac)
    assert roof.bandwidth_gbs == 320  # the memory clock does not follow the core clock
    # a card whose GEMM ceiling was measured ran at its sustained clock in that measurement
    a100 = replace(catalog.find("A100 PCIe 80GB"), base_clock_mhz=500.0, boost_clock_mhz=1410.0)
    assert roof_for(a100, "fp16", EFF).tensor_tflops == 312


def test_compute_bound_estimate_follows_the_clock(catalog):
    t4 = catalog.find("T4")
    w = Workload("k", (Kernel("mm", "matmul", 1e9, 0.0, 1e3, 0.0),), params=0.0, sample="row")
    e = estimate(w, t4, task="infer", precision="fp16", batch=1000, eff=EFF)
    # nearly all of the pass is the compute-bound kernel: activity ~1, the full-load clock
    compute_s = 1000 * 1e9 / (65e12 * 0.8 * 0.5)
    # the kernel's fixed cost is counted in SM cycles: stated at 1410 MHz, paid at the clock run
    first = compute_s + 10e-6 * 1410 / 1590  # timed at the boost clock to measure the load
    clock = sustained_clock(t4, EFF.clock_headroom, activity=compute_s / first)
    expected = compute_s / clock.fraction + 10e-6 * 1410 / clock.mhz
    assert e.latency_ms == pytest.approx(expected * 1e3, rel=1e-9)
    assert any("power-limited" in n for n in e.notes)


def test_activations_that_fit_the_l2_stay_on_chip(catalog):
    a100 = catalog.find("A100 SXM4 40GB")  # 40 MB L2 (src_l2)
    assert a100.l2_mb == 40 and a100.source("l2_mb")
    l2 = 40 * 2**20
    # one memory-bound kernel: 1e6 activation elements per sample in fp16 (2 MB a sample)
    w = Workload("k", (Kernel("copy", "memory", 1.0, 0.0, 5e5, 5e5),), params=0.0, sample="row")
    bw = 1555e9 * 0.5
    for batch in (8, 64):
        e = estimate(w, a100, task="infer", precision="fp16", batch=batch, eff=EFF)
        spill = max(0.0, batch * 2e6 - l2)  # only what does not fit goes to DRAM
        expected = max(batch * 1.0 / (19.5e12 * 0.8), spill / bw) + 10e-6
        assert e.latency_ms == pytest.approx(expected * 1e3, rel=1e-9)
    # without the L2 size every byte goes to DRAM
    e = estimate(w, replace(a100, l2_mb=None), task="infer", precision="fp16", batch=8, eff=EFF)
    assert e.latency_ms == pytest.approx((8 * 2e6 / bw + 10e-6) * 1e3, rel=1e-9)


def test_int8_runs_at_fp16_where_int8_units_are_slower(catalog):
    v100 = catalog.find("V100 SXM2 16GB")  # INT8 62.8 TOPS (DP4A), FP16 tensor 125 TFLOPS
    assert v100.peak_tflops("int8") == (125.0, "fp16")
    assert catalog.find("T4").peak_tflops("int8") == (130.0, "int8")
    bert = get_workload("bert-base", seq=128)
    i8 = estimate(bert, v100, task="infer", precision="int8", batch=64)
    f16 = estimate(bert, v100, task="infer", precision="fp16", batch=64)
    assert i8.precision_used == "fp16" and i8.throughput == pytest.approx(f16.throughput)
    assert "int8 is slower than fp16 on this device" in i8.notes[0]


def test_eager_inference_is_unfused_and_dispatched_op_by_op(catalog):
    l4 = catalog.find("L4")
    w = get_workload("resnet50")
    compiled = estimate(w, l4, task="infer", precision="fp16", batch=1)
    eager = estimate(w, l4, task="infer", precision="fp16", batch=1, engine="eager")
    eff = Efficiency()
    # batch 1 is all dispatch: every op (conv, BatchNorm, activation, add) a launch of its own
    ops = sum(1 for k in w.kernels if k.kind != "free")
    fused = sum(1 for k in w.kernels if k.kind != "free" and not k.fusable)
    # batch 1: the host dispatching sets the pace (the GPU runs what is queued meanwhile); fp16
    # eager is autocast, which casts the weight of each of the 53 convolutions and the final
    # matrix product on every call: 54 more ops
    casts = sum(1 for k in w.kernels if k.kind in ("conv", "matmul") and k.weight_elems)
    assert casts == 54
    assert eager.latency_ms == pytest.approx((ops + casts) * eff.eager_overhead_us * 1e-3)
    fp32 = estimate(w, l4, task="infer", precision="fp32", batch=1, engine="eager")
    assert fp32.latency_ms == pytest.approx(ops * eff.eager_overhead_us * 1e-3)
    assert compiled.latency_ms < eager.latency_ms / 5
    assert fused < ops
    # NVIDIA's table: FP32 latency flat from batch 1 to 4 (10.37, 10.24, 10.46 ms on a V100)
    v100 = catalog.find("V100 SXM2 16GB")
    flat = [
        estimate(w, v100, task="infer", precision="fp32", batch=b, engine="eager").latency_ms
        for b in (1, 2, 4)
    ]
    assert flat == pytest.approx([ops * eff.eager_overhead_us * 1e-3] * 3)
    with pytest.raises(Exception, match="`engine` 'jit': choose one of compiled, eager"):
        estimate(w, l4, task="infer", precision="fp16", batch=1, engine="jit")


def test_a_kernels_fixed_cost_follows_the_clock(catalog):
    # 100 tiny kernels: the pass is their fixed cost, paid at each card's clock (its activity is
    # low, so the power-limited L4 runs at its 2040 MHz boost clock, the A100 at 1410 MHz)
    w = Workload(
        "k",
        tuple(Kernel(f"e{i}", "elementwise", 1.0, 0.0, 1.0, 1.0) for i in range(100)),
        params=0.0,
        sample="row",
    )
    eff = replace(EFF, kernel_overhead_us=5.0)
    for name, mhz in (("L4", 2040.0), ("A100 SXM4 40GB", 1410.0)):
        e = estimate(w, catalog.find(name), task="infer", precision="fp16", batch=1, eff=eff)
        work = e.latency_ms * 1e-3 - 100 * 5e-6 * 1410 / mhz
        assert 0 <= work < 1e-9, name


def test_fused_attention_on_turing_and_later(catalog):
    # TensorRT's fused multi-head attention kernels exist for sm75 and later, not Volta's sm70
    assert [fuses_attention(catalog.find(n)) for n in ("T4", "A30", "H100 SXM5 80GB")] == [True] * 3
    assert not fuses_attention(catalog.find("V100 SXM2 16GB"))
    assert not fuses_attention(catalog.find("MI300X"))
    s, h, heads, layers = 128, 768, 12, 12
    w = get_workload("bert-base", seq=s)
    plain = launches(w.kernels, fuse=True)
    fused = launches(w.kernels, fuse=True, attention=True)
    # without fused attention the softmax is a kernel of its own (a row reduction is no GEMM
    # epilogue): scores, softmax, context; with it the three are one kernel
    assert len(plain) - len(fused) == 2 * layers
    assert sum(1 for r in plain if r.kind == "reduce") == layers
    assert not any(r.kind == "reduce" for r in fused)
    # an elementwise epilogue (GELU) still folds into its GEMM in both
    assert len(plain) == len(launches(w.kernels, fuse=False)) - layers
    assert launches(w.kernels, fuse=False, attention=True) == launches(w.kernels, fuse=False)
    core = [r for r in fused if r.kind == "matmul" and not r.weights]
    assert len(core) == layers
    first = core[0]
    # both products' FLOPs on the tensor cores, the softmax's on the vector units; reads Q, K, V
    # and writes the context: the probabilities stay on chip
    assert first.flops == pytest.approx(2 * (2.0 * s * s * h))
    assert first.vector_flops == pytest.approx(5.0 * heads * s * s)
    assert first.acts == pytest.approx(4 * s * h)
    assert (first.out, first.cols, first.split_k) == (s * h, h // heads, False)
    # an LLM's attention is one kernel already: nothing to merge
    llm = get_workload("llama-2-7b", seq=128, gen_tokens=16)
    assert launches(llm.kernels, fuse=True, attention=True) == launches(llm.kernels, fuse=True)


def test_a_part_filled_device_draws_less_power(catalog):
    # one GEMM whose output (2560 x 128, K = 128: no split-K) is 20 tiles of 128² or 80 of 64²
    # at half rate: half of a T4's 40 SMs' worth of work at a time, so the card draws about half
    # the power of a full load and sustains a higher clock (activity = busy share x time share)
    t4 = catalog.find("T4")
    rows, cols, depth = 2560, 128, 128
    mm = Kernel(
        "mm", "matmul", 2.0 * rows * cols * depth, 0.0, rows * depth, rows * cols, False, cols
    )
    w = Workload("k", (mm,), params=0.0, sample="row")
    e = estimate(w, t4, task="infer", precision="fp16", batch=1, eff=EFF)
    compute_s = mm.flops / (65e12 * 0.8 * 0.5 * 0.5)  # at boost, half the device's rate
    first = compute_s + 10e-6 * 1410 / 1590
    clock = sustained_clock(t4, EFF.clock_headroom, activity=0.5 * compute_s / first)
    expected = compute_s / clock.fraction + 10e-6 * 1410 / clock.mhz
    assert e.latency_ms == pytest.approx(expected * 1e3, rel=1e-9)
    full = sustained_clock(t4, EFF.clock_headroom, activity=compute_s / first)
    assert clock.mhz > 1.2 * full.mhz  # 2^(1/3) = 1.26 times the clock of a full device
