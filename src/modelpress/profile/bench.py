"""``bench()``: time models side by side on the same inputs, with their FLOP rate against the
machine's measured peak, the memory each session adds, and optionally a per-operator profile.

The models run in one process, interleaved round by round (``runtime.measure``), so that a slow
period of a shared machine hits every model alike. Inputs are the caller's, or generated to fit the
first model: a detector whose height and width are dynamic gets sizes it can run at (see
``verify.fit``), and the result says which sizes were used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import onnx_ir as ir

from modelpress.errors import InputError, OptionError, renamed
from modelpress.ir.feeds import check_feeds
from modelpress.profile.cost import profile_model
from modelpress.runtime.measure import (
    Timing,
    machine_peak_gflops,
    op_profile,
    peak_memory_mb,
    time_interleaved,
)
from modelpress.runtime.ort import OPT_LEVELS
from modelpress.runtime.ort_backend import OrtBackend, OrtOptions
from modelpress.runtime.session import Session
from modelpress.verify.fit import fit_inputs


@dataclass
class ModelBench:
    name: str
    timing: Timing
    ratio_vs_first: float
    flops: float
    gflops: float
    samples_per_s: float
    peak_memory_mb: float | None
    warnings: list[str] = field(default_factory=list)
    placement: list[str] = field(default_factory=list)  # node -> device and the copies implied
    operators: list[tuple[str, float, int]] | None = None  # (op, total ms, calls), most time first

    def to_dict(self) -> dict:
        return {
            "model": self.name,
            "timing": self.timing.to_dict(),
            "ratio_vs_first": self.ratio_vs_first,
            "flops": self.flops,
            "gflops": self.gflops,
            "samples_per_s": self.samples_per_s,
            "peak_memory_mb": self.peak_memory_mb,
            "warnings": self.warnings,
            "placement": self.placement,
            "operators": None
            if self.operators is None
            else [{"op": op, "ms": ms, "calls": n} for op, ms, n in self.operators],
        }


@dataclass
class BenchResult:
    backend: str
    device: str
    batch: int
    runs: int
    shapes: dict[str, list[int]]
    machine_peak_gflops: float
    models: list[ModelBench]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {**asdict(self), "models": [m.to_dict() for m in self.models]}


def _backend(backend: str, threads: int | None, ort_level: str, profile: bool):
    if backend == "ort":
        return OrtBackend(OrtOptions(intra_op_threads=threads, optimize=ort_level, profile=profile))
    if threads:
        import torch  # the torch backend is in use, so the extra is installed

        torch.set_num_threads(threads)
    return backend


def bench(
    models: list[ir.Model],
    *,
    names: list[str] | None = None,
    data: dict[str, np.ndarray] | None = None,
    dims: dict[str, int] | None = None,
    shapes: dict[str, tuple[int, ...]] | None = None,
    backend: str = "ort",
    device: str = "auto",
    place: list[str] | None = None,
    strict: bool = False,
    threads: int | None = None,
    ort_level: str = "all",
    runs: int = 50,
    warmup: int = 5,
    profile_ops: bool = False,
    progress: Callable[[str], None] | None = None,
    inputs: dict[str, np.ndarray] | None = None,
) -> BenchResult:
    """Time ``models`` (the first is the baseline) on the same inputs (``data``, one feed dict;
    ``inputs`` is its old name; generated when None); see the module."""
    inputs = renamed(data, inputs, new="data", old="inputs")
    if not models:
        raise OptionError("`models` is empty: nothing to time")
    if runs < 1:
        raise OptionError("`runs` must be at least 1")
    if warmup < 0:
        raise OptionError("`warmup` must not be negative")
    if threads is not None and threads < 1:
        raise OptionError("`threads` must be at least 1")
    if ort_level not in OPT_LEVELS:
        raise OptionError(f"`ort_level` {ort_level!r}: one of {', '.join(OPT_LEVELS)}")
    if profile_ops and backend != "ort":
        raise OptionError("a per-operator profile needs the ort `backend`")
    names = names or [f"model {i}" for i in range(len(models))]
    progress = progress or (lambda _msg: None)

    def session(model: ir.Model, profile: bool = False) -> Session:
        return Session(
            model,
            backend=_backend(backend, threads, ort_level, profile),
            device=device,
            place=place,
            strict=strict,
        )

    # The first session in a process pays for loading the runtime's libraries; it also finds the
    # inputs, so the peak memory measured below belongs to each model alone.
    first = session(models[0])
    notes: list[str] = []
    if inputs is None:
        fitted = fit_inputs(
            models[0], lambda f: first.run(f, check=False), dims=dims, shapes=shapes, input_sets=1
        )
        feeds = fitted.feeds[0]
        if fitted.note:
            notes.append(fitted.note)
    else:
        feeds = inputs
        check_feeds(models[0], feeds, source="`data`")
        first.run(feeds, check=False)
    sessions: list[Session] = []
    memory: list[float | None] = []
    for name, model in zip(names, models):
        holder: dict[str, Session] = {}

        def make(model=model, holder=holder, name=name):
            holder["s"] = session(model)
            try:
                holder["s"].run(feeds, check=False)
            except Exception as exc:  # noqa: BLE001 - any backend's error
                msg = (str(exc).strip() or type(exc).__name__).splitlines()[0][:200]
                raise InputError(
                    f"{name} fails on the inputs the first model runs on: {msg}"
                ) from None

        memory.append(peak_memory_mb(make))
        sessions.append(holder["s"])
    progress("timing")
    timings = time_interleaved(
        [lambda s=s: s.run(feeds, check=False) for s in sessions],
        runs=runs,
        warmup=warmup,
        progress=lambda r, n: progress(f"timing: round {r}/{n}"),
    )
    progress("measuring the machine's peak")
    peak = machine_peak_gflops()
    feed_shapes = {k: tuple(v.shape) for k, v in feeds.items()}
    batch = next((v.shape[0] for v in feeds.values() if v.ndim), 1)
    results = []
    for name, model, timing, mem, sess in zip(names, models, timings, memory, sessions):
        flops = profile_model(model, feed_shapes).flops
        seconds = timing.median_ms / 1e3
        results.append(
            ModelBench(
                name=name,
                timing=timing,
                ratio_vs_first=timing.median_ms / timings[0].median_ms,
                flops=flops,
                gflops=flops / seconds / 1e9 if seconds > 0 else 0.0,
                samples_per_s=batch / seconds if seconds > 0 else 0.0,
                peak_memory_mb=mem,
                warnings=list(sess.warnings),
                placement=list(sess.plan.log_lines()),
            )
        )
    if profile_ops:
        for result, model, sess in zip(results, models, sessions):
            progress(f"profiling {result.name}")
            prepared = _backend(backend, threads, ort_level, True).prepare(
                model, device=sess.plan.devices[0] if sess.plan.devices else "cpu"
            )
            for _ in range(max(runs // 5, 3)):
                prepared.run(feeds)
            result.operators = op_profile(prepared.end_profiling())
    return BenchResult(
        backend=backend,
        device=sessions[0].device,
        batch=batch,
        runs=runs,
        shapes={k: list(v) for k, v in feed_shapes.items()},
        machine_peak_gflops=peak,
        models=results,
        notes=notes,
    )
