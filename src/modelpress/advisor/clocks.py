"""The clock a card sustains under a dense tensor load: power-limited cards do not hold boost.

Datasheet tensor peaks assume the boost clock. The base clock is the clock the vendor guarantees
within the board's TDP under a worst-case load. Dynamic power grows about as the cube of the
clock along the voltage-frequency curve (P ∝ C·V²·f with V roughly ∝ f in the boost range), so
a load that draws a fraction p of the worst-case power at the same clock sustains

    f = min(boost, base · p^(-1/3)) = min(boost, headroom · base)

``headroom`` = p^(-1/3) is one number for all cards (``Efficiency.clock_headroom``), fitted with
the eager-training factors on the published training rows (``benchmarks/bench_advisor.py``).
Precondition: the catalog has both clocks for the card (``base_clock_mhz``, ``boost_clock_mhz``
with ``src_clock``); without them the card is taken to hold its boost clock. A card whose GEMM
ceiling was measured (``matmul_bf16_tflops_measured``) already ran at its sustained clock in that
measurement, so the factor is not applied to its tensor peak a second time.

A load is not always dense: a batch-1 pass spends much of its time between kernels (launch,
ramp-up, tail), where the card idles and draws far less power, and a small kernel's tiles occupy
only part of the SMs (``waves.py``), the rest idle. Its power scales with its activity a, the
share of its time spent running kernels, compute-bound or streaming memory, with a compute-bound
kernel's time weighted by the share of the device its tiles keep busy (``estimate`` measures it
on a first pass at the boost clock), so it sustains f = min(boost, headroom · base · a^(-1/3)).
A batch-1 BERT pass on a 70 W T4 fills only part of its SMs and runs at a higher clock than the
full batch: NVIDIA's demoBERT table has BERT-Large FP16 at sequence 384 reach 93% of the batch-128
throughput at batch 1 (86.9 against 93.8 sequences/s), where the full-load clock at both batches
predicted 70%.

The fixed cost of a kernel (``Efficiency.kernel_overhead_us``: the front end's launch work, the
first wave's ramp-up, the last wave's tail) is counted in SM clock cycles, so a card pays it in
proportion to 1 / its clock (``kernel_overhead_s``). The factor is stated at
``REFERENCE_CLOCK_MHZ``, the A100's boost clock; a card without clocks in the catalog pays it as
stated. It is what makes a 72 W L4 at 2 GHz beat a 400 W A100 at batch 1 (MLPerf ResNet-50
SingleStream: 0.36 against 0.45 ms), where the pass is a chain of short kernels.

What it changes: a 70 W T4 (base 585, boost 1590 MHz) sustains about ``headroom`` × 0.37 of its
boost clock; a 400 W A100 SXM4 (1095 / 1410 MHz) holds its boost.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelpress.advisor.catalog import GPU


@dataclass(frozen=True)
class SustainedClock:
    fraction: float  # of the boost clock (1.0: holds boost)
    mhz: float | None
    note: str = ""


def sustained_clock(gpu: GPU, headroom: float, *, activity: float = 1.0) -> SustainedClock:
    """Fraction of the boost clock ``gpu`` sustains under a load that keeps it busy a share
    ``activity`` of the time (module rule; 0 or less: boost)."""
    base, boost = gpu.base_clock_mhz, gpu.boost_clock_mhz
    if not base or not boost or headroom <= 0 or activity <= 0:
        return SustainedClock(1.0, boost)
    mhz = min(boost, headroom * base * min(activity, 1.0) ** (-1 / 3))
    if mhz >= boost:
        return SustainedClock(1.0, boost)
    note = (
        f"power-limited ({gpu.tdp_w:g} W): sustains about {mhz:.0f} of its {boost:.0f} MHz boost "
        f"clock under load ({headroom:.2f} x the {base:.0f} MHz base clock)"
        if gpu.tdp_w
        else f"sustains about {mhz:.0f} of its {boost:.0f} MHz boost clock under load"
    )
    return SustainedClock(mhz / boost, mhz, note)


REFERENCE_CLOCK_MHZ = 1410.0  # the clock kernel_overhead_us is stated at (A100 SXM4/PCIe boost)


def kernel_overhead_s(overhead_us: float, clock_mhz: float | None) -> float:
    """Seconds of a kernel's fixed cost on a card running at ``clock_mhz`` (module rule)."""
    scale = REFERENCE_CLOCK_MHZ / clock_mhz if clock_mhz else 1.0
    return overhead_us * 1e-6 * scale


__all__ = ["REFERENCE_CLOCK_MHZ", "SustainedClock", "kernel_overhead_s", "sustained_clock"]
