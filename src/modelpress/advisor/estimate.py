"""Roofline estimate of a workload on a device: memory fit, time, throughput, latency.

Each kernel takes max(FLOPs / achievable compute, bytes / achievable bandwidth) plus a fixed
per-kernel overhead; a pass is the sum over its kernels (kernels run one after another on a GPU
stream). Achievable compute is the dense peak at the precision × the GEMM ceiling × the factor
for the kernel's kind; vector ops use the FP32 vector peak. See ``efficiency.py`` for the factors.

- Wave quantisation and split-K (``waves.py``): a matrix-like forward kernel whose output
  width is known (``Kernel.out_cols``) reaches the share of the device its output tiles (and
  the slices of a deep reduction) keep busy, on devices whose SM count the catalog has.
- Clocks: peaks are scaled to the clock the card sustains at the pass's load (``clocks.py``); the
  pass is timed at boost first to measure that load (the share of its time spent in kernels,
  a compute-bound kernel's time weighted by the share of the device its tiles keep busy).
- Fused attention (``launches.py``): on Turing and later a compiled engine runs an encoder's
  scores, softmax and context as one kernel (TensorRT's fMHA), the probabilities on chip, the
  softmax at the vector rate; elsewhere the softmax is a kernel of its own.
- L2: the part of a kernel's activations (input and output, whole batch) that fits in the L2
  cache stays on chip between producer and consumer; only the rest goes to DRAM. Weights always
  come from DRAM (a pass reads each once).
- Precision and clocks: what the device offers a kernel (``roof.py``); FP32 convolutions on
  SIMT cores take no conv factor (cuDNN's FP32 kernels run like SGEMM).
- Gathers: a ``memory`` kernel with weights (an embedding lookup) reads the table rows it
  writes, not the whole table (its backward, in training, still writes a gradient of the table's
  size).
- Inference runs a compiled graph (``engine="compiled"``): elementwise ops and BatchNorm fuse
  into the producing kernel (no launch, no extra memory trip); each kernel pays a fixed cost
  counted in SM cycles (``clocks.kernel_overhead_s``). ``engine="eager"`` (PyTorch without a
  compiler) runs every op as its own kernel, dispatched by the host while the GPU runs
  (``dispatch.py``: the pass takes the longer of the two; autocast's casts below 32 bits).
  Training runs every op as its own kernel too, at the host's dispatch cost per launch.
- Training: backward costs 2× the forward FLOPs and bytes, with two kernels (input and weight
  gradient) for ops with weights; then an optimizer step streams every parameter's state.
- Data-parallel training on N devices all-reduces the gradients (ring: 2(N-1)/N × bytes over
  the link); the all-reduce overlaps the backward pass, so a step takes forward + max(backward,
  all-reduce) + optimizer.
- Inference on N devices: N replicas when the model fits one device, else tensor parallelism
  (weights and work split N ways, an all-reduce after every second matrix product).
- Decoder LLMs infer as a prefill of the prompt then ``gen_tokens`` decode steps; throughput
  counts generated tokens, ``latency_ms`` is the time per generated token.
- Memory: ``memory.py``.
"""

from __future__ import annotations

from dataclasses import asdict, astuple, dataclass

from modelpress.advisor.catalog import GPU
from modelpress.advisor.clocks import kernel_overhead_s
from modelpress.advisor.dispatch import autocast_casts, overlapped
from modelpress.advisor.efficiency import DEFAULT_EFFICIENCY, Efficiency
from modelpress.advisor.launches import Launch, fuses_attention, launches
from modelpress.advisor.memory import MAX_BATCH, Footprint
from modelpress.advisor.roof import Roof, roof_for
from modelpress.advisor.waves import gemm_utilisation
from modelpress.errors import OptionError
from modelpress.profile.training import is_mixed, precision_bytes, training_memory
from modelpress.profile.workload import TENSOR_KINDS, Workload

TASKS = ("train", "infer")
# How inference runs: a compiled engine (TensorRT, ONNX Runtime: fused epilogues, planned memory)
# or eagerly, op by op (PyTorch without a compiler), priced like the forward pass of training.
ENGINES = ("compiled", "eager")
COLLECTIVE_LATENCY_S = 10e-6  # fixed cost of one all-reduce call


@dataclass(frozen=True)
class PassTime:
    seconds: float
    compute_s: float  # in kernels limited by compute
    memory_s: float  # in kernels limited by bandwidth
    overhead_s: float  # fixed per-kernel cost
    kernels: int
    idle_s: float = 0.0  # of compute_s, the share of the device its tiles leave idle

    @property
    def bound(self) -> str:
        parts = {"compute": self.compute_s, "memory": self.memory_s, "overhead": self.overhead_s}
        return max(parts, key=parts.get)

    def __add__(self, other: PassTime) -> PassTime:
        return PassTime(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))


@dataclass(frozen=True)
class Estimate:
    gpu: str
    num_gpus: int
    task: str
    precision: str
    precision_used: str
    batch: int  # per device
    fits: bool
    memory_gb: float  # needed per device
    memory_capacity_gb: float
    throughput: float  # all devices together
    unit: str
    latency_ms: float  # one batch (per generated token for decoder LLMs)
    bound: str  # compute / memory / overhead / interconnect
    comm_ms: float
    achieved_tflops: float
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["notes"] = list(self.notes)
        return d


@dataclass(frozen=True)
class Target:
    """What a pass runs on: the device's roof, the efficiency factors, bytes per element."""

    roof: Roof
    eff: Efficiency
    width: float


@dataclass(frozen=True)
class PassMode:
    """How a pass runs: ``scale`` multiplies its work (backward = 2), ``split`` divides it
    across tensor-parallel devices, ``eager`` runs it op by op from the host."""

    scale: float = 1.0
    split: int = 1
    eager: bool = False


FORWARD = PassMode()


def _kernel_costs(rows: list[Launch], batch: float, on: Target, how: PassMode = FORWARD):
    """Per launched kernel: (kind, FLOPs, bytes, compute s, memory s, launches, share of the
    device its tiles keep busy)."""
    # ``eager`` (fitted on training) covers what slows training kernels beyond missing fusion:
    # autograd's backward kernels, BatchNorm statistics. Eager inference runs the same forward
    # kernels as an engine, only unfused and dispatched op by op: no factor.
    roof, eff, width = on.roof, on.eff, on.width
    scale, split = how.scale, how.split
    c_mult = eff.eager if how.eager and scale > 1 else 1.0
    bw = roof.bandwidth_gbs * 1e9 * eff.bandwidth * c_mult
    for kind, flops, weights, acts, out, cols, splits, vector_flops in rows:
        n_launch = 2 if (scale > 1 and weights) else 1  # input- and weight-gradient kernels
        if kind in TENSOR_KINDS:
            # the conv factor is the cost of feeding tensor cores from an implicit GEMM; FP32
            # convolutions on the SIMT cores run as well as SGEMM (cuDNN's FP32 kernels, with
            # Winograd for 3x3 layers)
            factor = 1.0 if kind == "conv" and roof.precision_used == "fp32" else getattr(eff, kind)
            rate = roof.tensor_tflops * 1e12 * roof.gemm_ceiling * factor * c_mult
            busy = 1.0
            if roof.sm_count and cols and out and scale == 1:
                # a tensor-parallel device computes its share of the output columns
                busy = gemm_utilisation(
                    out * batch,
                    cols / split,
                    roof.sm_count,
                    depth=flops / (2 * out) if splits else 0.0,
                )
                rate *= busy
        else:
            rate = roof.vector_tflops * 1e12 * roof.gemm_ceiling * c_mult
            busy = 1.0
        f = scale * flops * batch / split
        # a fused kernel's vector work (attention's softmax) runs beside its tensor work, not in it
        t_vector = (
            scale * vector_flops * batch / split / (roof.vector_tflops * 1e12 * roof.gemm_ceiling)
        )
        # activations that fit in the L2 cache stay on chip between producer and consumer; only
        # the part of the kernel's input and output that does not fit goes to DRAM
        act_bytes = max(0.0, scale * acts * batch * width / split - roof.l2_bytes)
        if kind == "memory" and scale == 1:
            weights = min(weights, out * batch)  # a gather reads the rows it writes
        b = scale * weights * width / split + act_bytes
        yield kind, f, b, f / rate + t_vector, b / bw, n_launch, busy


def _time(
    rows: list[Launch],
    batch: float,
    on: Target,
    how: PassMode = FORWARD,
    *,
    casts: int = 0,
    training: bool = False,
) -> PassTime:
    """Time of one pass over ``batch`` samples run as ``how`` says; an eager pass dispatches
    ``casts`` more ops (autocast) from the host: summed with the GPU's time in ``training``,
    else overlapped with it."""
    compute = memory = idle = 0.0
    count = 0
    for _, _, _, t_c, t_m, n_launch, busy in _kernel_costs(rows, batch, on, how):
        if t_c >= t_m:
            compute += t_c
            idle += t_c * (1.0 - busy)
        else:
            memory += t_m
        count += n_launch
    count += casts
    eff, clock_mhz = on.eff, on.roof.clock_mhz
    if not how.eager:
        overhead = count * kernel_overhead_s(eff.kernel_overhead_us, clock_mhz)
    elif training:
        overhead = count * eff.eager_overhead_us * 1e-6
    else:
        gpu = compute + memory + count * kernel_overhead_s(eff.kernel_overhead_us, clock_mhz)
        overhead = overlapped(count, gpu, eff.eager_overhead_us) - compute - memory
    return PassTime(compute + memory + overhead, compute, memory, overhead, count, idle)


@dataclass(frozen=True)
class KernelPoint:
    kind: str
    flops: float
    bytes: float
    seconds: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else 0.0

    @property
    def tflops(self) -> float:
        return self.flops / self.seconds / 1e12 if self.seconds else 0.0


def kernel_points(
    workload: Workload,
    gpu: GPU,
    *,
    precision: str,
    batch: int,
    eff: Efficiency = DEFAULT_EFFICIENCY,
) -> list[KernelPoint]:
    """The forward (inference, fused) kernels at ``batch`` with their predicted time, for a
    roofline chart."""
    roof = roof_for(gpu, precision, eff)
    width = max(precision_bytes(precision), precision_bytes(roof.precision_used))
    kernels = workload.decode if workload.is_generative else workload.kernels
    over = kernel_overhead_s(eff.kernel_overhead_us, roof.clock_mhz)
    return [
        KernelPoint(kind, f, b, max(t_c, t_m) + over)
        for kind, f, b, t_c, t_m, *_ in _kernel_costs(
            launches(kernels, fuse=True, attention=fuses_attention(gpu)),
            batch,
            Target(roof, eff, width),
        )
    ]


def _allreduce_s(nbytes: float, n: int, link_gbs: float, eff: Efficiency) -> float:
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / (link_gbs * 1e9 * eff.bandwidth) + COLLECTIVE_LATENCY_S


def estimate(
    workload: Workload,
    gpu: GPU,
    *,
    task: str,
    precision: str,
    batch: int,
    num_gpus: int = 1,
    optimizer: str = "adam",
    eff: Efficiency = DEFAULT_EFFICIENCY,
    roof: Roof | None = None,
    engine: str = "compiled",
) -> Estimate:
    """Throughput, latency and memory of ``workload`` on ``num_gpus`` × ``gpu`` at ``batch`` per
    device; inference runs on a compiled ``engine`` (fused) or ``"eager"`` (op by op).

    The clock depends on the load (``clocks.py``): the pass is first timed at the boost clock,
    the share of its time spent running kernels (not in per-kernel launch gaps) is its activity,
    and a card that cannot hold its boost clock at that activity is timed again at the clock it
    sustains. A given ``roof`` is used as it is.
    """
    if task not in TASKS:
        raise OptionError(f"`task` {task!r}: choose one of {', '.join(TASKS)}")
    if engine not in ENGINES:
        raise OptionError(f"`engine` {engine!r}: choose one of {', '.join(ENGINES)}")
    if batch < 1 or num_gpus < 1:
        raise OptionError("`batch` and `num_gpus` must be at least 1")
    args = dict(
        task=task,
        precision=precision,
        batch=batch,
        num_gpus=num_gpus,
        optimizer=optimizer,
        eff=eff,
        eager=engine == "eager",
    )
    if roof is not None:
        return _estimate(workload, gpu, roof=roof, **args)[0]
    boost = roof_for(gpu, precision, eff, activity=0.0)
    first, activity = _estimate(workload, gpu, roof=boost, **args)
    loaded = roof_for(gpu, precision, eff, activity=activity)
    if (loaded.tensor_tflops, loaded.vector_tflops) == (boost.tensor_tflops, boost.vector_tflops):
        return first
    return _estimate(workload, gpu, roof=loaded, **args)[0]


def _estimate(
    workload: Workload,
    gpu: GPU,
    *,
    task: str,
    precision: str,
    batch: int,
    num_gpus: int,
    optimizer: str,
    eff: Efficiency,
    roof: Roof,
    eager: bool,
) -> tuple[Estimate, float]:
    """The estimate on ``roof`` and the pass's activity (the share of its time in kernels)."""
    # a precision that falls back to a wider one also stores its tensors at the wider width
    width = max(precision_bytes(precision), precision_bytes(roof.precision_used))
    notes: list[str] = []
    if roof.precision_used != precision:
        notes.append(
            f"{precision} is slower than {roof.precision_used} on this device: runs at the {roof.precision_used} rate"
            if gpu.own_peak(precision)
            else f"no {precision} units: runs at the {roof.precision_used} rate"
        )
    if roof.clock_note:
        notes.append(roof.clock_note)
    link = gpu.link_gbs(num_gpus) if num_gpus > 1 else None
    if num_gpus > 1 and link is None:
        raise OptionError(
            f"{gpu.name}: the catalog has no interconnect figure for {num_gpus} devices"
        )
    held = Footprint(workload, task, precision, optimizer)
    # inference on several devices: replicas when the model fits one, else tensor parallel
    alone = task != "infer" or num_gpus == 1 or held.device_gb(batch) <= roof.memory_gb
    split = 1 if alone else num_gpus
    need_gb = held.device_gb(batch, split=split)
    fits = need_gb <= roof.memory_gb
    comm = 0.0
    on = Target(roof, eff, width)
    if task == "train":
        rows = launches(workload.kernels, fuse=False)
        casts = autocast_casts(rows, precision)  # forward: weights; backward: their gradients
        fwd = _time(rows, batch, on, PassMode(eager=True), casts=casts, training=True)
        backward = PassMode(scale=2.0, eager=True)
        bwd = _time(rows, batch, on, backward, casts=casts, training=True)
        mem = training_memory(workload.params, precision=precision, optimizer=optimizer)
        # optimizer step: read gradients, master weights and state, write weights and state back
        opt_bytes = mem.gradients + 2 * (mem.master_weights + mem.optimizer_state) + mem.weights
        opt_s = opt_bytes / (roof.bandwidth_gbs * 1e9 * eff.bandwidth * eff.eager)
        opt = PassTime(opt_s, 0.0, opt_s, 0.0, 0)
        if link:
            comm = _allreduce_s(mem.gradients, num_gpus, link[0], eff)
            notes.append(
                f"data parallel: gradient all-reduce over {link[1]} {comm * 1e3:.2f} ms per step, overlapped with backward"
            )
        step = fwd + bwd + opt
        seconds = fwd.seconds + max(bwd.seconds, comm) + opt.seconds
        activity = (step.compute_s + step.memory_s) / step.seconds
        throughput = (
            batch
            * num_gpus
            / seconds
            * (workload.tokens_per_sample if workload.unit == "tokens/s" else 1)
        )
        latency = seconds
        flops = 3 * workload.flops_per_sample * batch
        bound = "interconnect" if comm > bwd.seconds else step.bound
        if is_mixed(precision):
            notes.append("mixed precision: fp32 master weights and optimizer state")
    else:
        rows = launches(workload.kernels, fuse=not eager, attention=fuses_attention(gpu))
        casts = autocast_casts(rows, precision) if eager else 0
        how = PassMode(split=split, eager=eager)
        fwd = _time(rows, batch, on, how, casts=casts)
        if split > 1:
            row_parallel = [r for r in rows if r.kind == "matmul" and r.weights][1::2]
            # activations of a row-parallel product's output, summed across devices
            out_elems = sum(r.acts for r in row_parallel) / 2
            comm = _allreduce_s(
                out_elems * batch * width, num_gpus, link[0], eff
            ) + COLLECTIVE_LATENCY_S * len(row_parallel)
            notes.append(
                f"tensor parallel over {num_gpus} devices ({link[1]}): the model does not fit one"
            )
        replicas = num_gpus if split == 1 else 1
        if workload.is_generative:
            dec_rows = launches(workload.decode, fuse=not eager, attention=fuses_attention(gpu))
            dec_casts = autocast_casts(dec_rows, precision) if eager else 0
            step_t = _time(dec_rows, batch, on, how, casts=dec_casts)
            dec_comm = comm / max(workload.tokens_per_sample, 1) if split > 1 else 0.0
            decode_s = step_t.seconds + dec_comm
            total = fwd.seconds + comm + workload.gen_tokens * decode_s
            throughput = replicas * batch * workload.gen_tokens / total
            latency = decode_s
            flops = (
                workload.flops_per_sample * batch
                + workload.gen_tokens * sum(k.flops for k in workload.decode) * batch
            )
            seconds = total
            activity = (
                fwd.compute_s
                + workload.gen_tokens * step_t.compute_s
                + fwd.memory_s
                + workload.gen_tokens * step_t.memory_s
            ) / total
            bound = step_t.bound
            notes.append(
                f"prefill {fwd.seconds * 1e3:.1f} ms, {workload.gen_tokens} decode steps of {decode_s * 1e3:.2f} ms"
            )
        else:
            seconds = fwd.seconds + comm
            activity = (fwd.compute_s + fwd.memory_s - fwd.idle_s) / seconds
            throughput = replicas * batch / seconds
            latency = seconds
            flops = workload.flops_per_sample * batch
            bound = "interconnect" if comm > fwd.seconds else fwd.bound
    if not fits:
        notes.append(f"needs {need_gb:.1f} GB per device, has {roof.memory_gb:g} GB")
    est = Estimate(
        gpu=gpu.name,
        num_gpus=num_gpus,
        task=task,
        precision=precision,
        precision_used=roof.precision_used,
        batch=batch,
        fits=fits,
        memory_gb=round(need_gb, 3),
        memory_capacity_gb=roof.memory_gb,
        throughput=throughput,
        unit=workload.unit,
        latency_ms=latency * 1e3,
        bound=bound,
        comm_ms=comm * 1e3,
        achieved_tflops=flops / seconds / 1e12 / (split if split > 1 else 1),
        notes=tuple(notes),
    )
    return est, activity


def max_batch(
    workload: Workload,
    gpu: GPU,
    *,
    task: str,
    precision: str,
    num_gpus: int = 1,
    optimizer: str = "adam",
) -> int:
    """Largest per-device batch of ``workload`` that fits ``gpu`` (0 when not even one sample
    fits): on one device, or for inference split across ``num_gpus`` (tensor parallel)."""
    held = Footprint(workload, task, precision, optimizer)
    return held.max_batch(gpu.memory_gb, num_gpus=num_gpus)


def best_under_latency(
    workload: Workload,
    gpu: GPU,
    *,
    latency_ms: float,
    precision: str,
    num_gpus: int = 1,
    eff: Efficiency = DEFAULT_EFFICIENCY,
    cap: int = MAX_BATCH,
    engine: str = "compiled",
) -> Estimate | None:
    """The inference batch (at most ``cap``) with the highest throughput whose latency meets
    ``latency_ms`` (None when even batch 1 misses it or nothing fits). Latency grows with the
    batch."""
    top = min(
        cap,
        max_batch(workload, gpu, task="infer", precision=precision, num_gpus=num_gpus),
    )
    if top == 0:
        return None

    def at(b: int) -> Estimate:
        return estimate(
            workload,
            gpu,
            task="infer",
            precision=precision,
            batch=b,
            num_gpus=num_gpus,
            eff=eff,
            engine=engine,
        )

    first = at(1)
    if first.latency_ms > latency_ms:
        return None
    lo, hi = 1, top + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if at(mid).latency_ms <= latency_ms else (lo, mid)
    return at(lo)


def time_to_train(est: Estimate, amount: float) -> float:
    """Seconds to process ``amount`` samples or tokens (in the estimate's unit) at its throughput."""
    if est.task != "train":
        raise OptionError("time to train needs a training estimate (`task` train)")
    return amount / est.throughput


__all__ = [
    "ENGINES",
    "TASKS",
    "Estimate",
    "KernelPoint",
    "PassTime",
    "Roof",
    "best_under_latency",
    "estimate",
    "kernel_points",
    "max_batch",
    "roof_for",
    "time_to_train",
]
