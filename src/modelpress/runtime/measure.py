"""Timing and memory measurement for ``bench``: interleaved runs, peak RSS, the machine's peak.

Variants are timed round-robin (one run of each per round) so that a slow period of a shared
machine hits every variant alike; results are medians with the 25th-75th percentile spread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelpress.ir import parse
from modelpress.runtime import ort as mp_ort
from modelpress.runtime.ort import session


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p25_ms: float
    p75_ms: float
    runs: int

    @classmethod
    def from_seconds(cls, samples: list[float]) -> Timing:
        a = np.asarray(samples) * 1e3
        return cls(
            float(np.median(a)), float(np.percentile(a, 25)), float(np.percentile(a, 75)), len(a)
        )

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def time_interleaved(
    fns: list[Callable[[], object]], *, runs: int, warmup: int = 3, progress=None
) -> list[Timing]:
    """Time each function ``runs`` times, round-robin, after ``warmup`` untimed rounds.

    Round ``r`` starts at function ``r mod n``: each function follows each other one equally
    often, so none always pays for the caches the same predecessor left (a small model timed
    right after a large one read a few percent slower when the order was fixed).
    """
    for _ in range(warmup):
        for fn in fns:
            fn()
    samples: list[list[float]] = [[] for _ in fns]
    n = len(fns)
    for r in range(runs):
        for i in ((r + k) % n for k in range(n)):
            t0 = time.perf_counter()
            fns[i]()
            samples[i].append(time.perf_counter() - t0)
        if progress:
            progress(r + 1, runs)
    return [Timing.from_seconds(s) for s in samples]


def compare_latency(
    models: list, feeds: dict[str, np.ndarray], *, budget_s: float = 2.0, max_runs: int = 50
) -> list[Timing]:
    """ONNX Runtime CPU latency of several models on the same ``feeds``, interleaved, in about
    ``budget_s`` seconds (at least 5 runs each). Each session's pool does not spin between runs:
    idle spinning pools would steal the cores of the session being timed. The process's own
    ONNX Runtime settings (a global pool, if one was made) are left as they are."""

    def options():
        so = mp_ort.session_options()
        if so.use_per_session_threads:
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return so

    runs_of = [mp_ort.session(m, options=options()).run for m in models]
    fns = [lambda run=run: run(None, feeds) for run in runs_of]
    t0 = time.perf_counter()
    for fn in fns:  # warm-up, and the cost of one round
        fn()
    per_round = time.perf_counter() - t0
    runs = int(min(max_runs, max(5, budget_s / max(per_round, 1e-6))))
    return time_interleaved(fns, runs=runs, warmup=1)


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_memory_mb(fn: Callable[[], object]) -> float | None:
    """Peak resident memory that ``fn`` adds to the process, in MiB (Linux; None elsewhere).

    Writing 5 to /proc/self/clear_refs resets the kernel's high-water mark (VmHWM), so the peak
    seen afterwards belongs to ``fn`` alone.
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    base = _status_kib("VmRSS")
    fn()
    peak = _status_kib("VmHWM")
    if base is None or peak is None:
        return None
    return max(peak - base, 0) / 1024


def machine_peak_gflops(*, n: int = 1024, runs: int = 10) -> float:
    """Measured fp32 matrix-product throughput of this machine under ONNX Runtime, in GFLOP/s."""

    text = f"""<ir_version: 8, opset_import: ["" : 17]>
    mm (float[{n},{n}] a, float[{n},{n}] b) => (float[{n},{n}] c) {{ c = MatMul(a, b) }}"""
    sess = session(parse(text), optimize="all")
    rng = np.random.default_rng(0)
    feeds = {
        "a": rng.standard_normal((n, n), dtype=np.float32),
        "b": rng.standard_normal((n, n), dtype=np.float32),
    }
    best = min(
        time_interleaved([lambda: sess.run(None, feeds)], runs=runs, warmup=2)[0].p25_ms, 1e9
    )
    return 2 * n**3 / (best / 1e3) / 1e9


def op_profile(trace_path: str) -> list[tuple[str, float, int]]:
    """(op type, total ms, calls) from an ONNX Runtime profiler trace, most time first."""
    import json

    path = Path(trace_path)
    events = json.loads(path.read_text())
    path.unlink(missing_ok=True)
    totals: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            op = e.get("args", {}).get("op_name", "?")
            t = totals.setdefault(op, [0.0, 0])
            t[0] += e.get("dur", 0) / 1e3
            t[1] += 1
    return sorted(((op, ms, int(n)) for op, (ms, n) in totals.items()), key=lambda r: -r[1])


def top_ops(model, feeds: dict[str, np.ndarray], *, runs: int = 10, count: int = 4) -> str:
    """The op types ONNX Runtime spends most of its kernel time in over a few profiled runs
    (``QLinearMul 31%, QLinearConv 28%, ...``); the profiler's trace file is removed."""
    import os
    import tempfile

    so = mp_ort.session_options(profile=True)
    so.profile_file_prefix = os.path.join(tempfile.gettempdir(), "modelpress_profile")
    try:
        sess = mp_ort.session(model, options=so)
        for _ in range(runs):
            sess.run(None, feeds)
        rows = op_profile(sess.end_profiling())
    except Exception:  # noqa: BLE001 - a courtesy on top of a timing
        return ""
    total = sum(ms for _, ms, _ in rows) or 1.0
    return ", ".join(f"{op} {100 * ms / total:.0f}%" for op, ms, _ in rows[:count])
