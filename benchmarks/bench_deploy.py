"""`modelpress deploy` on the zoo's models: the folder, the plan, and the plan measured.

For each model: ``deploy()`` with its validation data (the search within the accuracy budget,
the server's own cost calibrated here, the plan, the folder, the check), then the chosen plan
measured again ``--reps - 1`` more times (a fresh server each time, open-loop Poisson arrivals at
the replica's rate, JSON requests, the load client on the same cores). The page puts the
promised p99 beside every measurement, and says whether the median holds within 1.25x.

The folder's files are read back by their tools during ``deploy()``; here the KServe manifest is
also round-tripped through the ``kserve`` package's generated models (``kserve==0.21.0`` and
``kubernetes==37.0.2``, installed with --no-deps into benchmarks/_work/kserve: the ``kserve``
package's own ``__init__`` needs its server's dependencies, so only ``kserve.models`` is loaded).

    .venv/bin/python benchmarks/bench_deploy.py [--quick] [--models resnet-digits minilm]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(HERE))

# model → (qps, p99 ms, labels key, max accuracy drop): targets this 2-core CPU can meet
TARGETS = {
    "resnet-digits": (150.0, 50.0, "y", 0.01),
    "minilm": (8.0, 400.0, None, 0.01),
}
KSERVE = HERE / "_work" / "kserve"
KSERVE_PACKAGES = [
    "kserve==0.21.0",
    "kubernetes==37.0.2",
    "oauthlib",
    "requests-oauthlib",
    "websocket-client",
    "durationpy",
]


def _kserve_models() -> str:
    """Make ``kserve.models`` importable without ``kserve/__init__`` (see the docstring)."""
    if not (KSERVE / "kserve").is_dir():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(KSERVE)]
            + KSERVE_PACKAGES,
            check=True,
        )
    sys.path.insert(0, str(KSERVE))
    pkg = types.ModuleType("kserve")
    pkg.__path__ = [str(KSERVE / "kserve")]
    sys.modules["kserve"] = pkg
    import kserve.models  # noqa: F401

    return "kserve 0.21.0 models + kubernetes 37.0.2"


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_model(name: str, folder: Path, reps: int, seconds: float, budget_s: float) -> dict:
    from bench_auto import data_for

    from modelpress import zoo
    from modelpress.deploy import deploy
    from modelpress.deploy.check import check_option
    from modelpress.deploy.plan import queue_size, sample_request
    from modelpress.deploy.validate import check_kserve
    from modelpress.ir import load
    from modelpress.ir.feeds import load_npz

    qps, p99, labels, drop = TARGETS[name]
    model = zoo.build(name, folder / f"{name}.onnx")
    data = data_for(name, folder)
    out = folder / f"{name}-deploy"
    t0 = time.perf_counter()
    r = deploy(
        model,
        out,
        qps=qps,
        p99_ms=p99,
        data=data,
        labels_key=labels,
        max_accuracy_drop=drop,
        time_budget_s=budget_s,
        check_seconds=seconds,
    )
    took = time.perf_counter() - t0
    kserve = check_kserve(out / "kserve.yaml")
    o = next(x for x in r.plan.options if x.kind == "cpu")
    checks = [r.check]
    sample = sample_request(load(out / r.settings.model), r.name, load_npz(data) if data else None)
    for rep in range(1, reps):
        checks.append(
            check_option(
                o,
                model_path=str(out / r.settings.model),
                name=r.name,
                body=sample.body,
                qps=qps,
                max_queue=queue_size(o, qps=qps, p99_ms=p99),
                max_seconds=seconds,
                seed=rep,
            )
        )
    measured = [c.load.p99_ms for c in checks]
    med = statistics.median(measured)
    w = r.search.winner if r.search else None
    return {
        "model": name,
        "qps": qps,
        "p99_target_ms": p99,
        "deploy_seconds": took,
        "winner": w.label if w else "as given",
        "winner_ratio": w.ratio if w else None,
        "winner_drop": w.drop if w else None,
        "server_cost": r.cost.to_dict(),
        "request_bytes": len(sample.body),
        "answer_bytes": sample.answer_bytes,
        "replicas": o.replicas,
        "max_batch": o.max_batch,
        "max_delay_ms": o.max_delay_ms,
        "max_queue": queue_size(o, qps=qps, p99_ms=p99),
        "model_ms_batch1": float(r.plan.options[0].curve(1)) * 1e3,
        "promised_p99_ms": o.queue.p99_ms,
        "promised_p50_ms": o.queue.p50_ms,
        "rate_per_replica": qps / o.replicas,
        "measured_p99_ms": measured,
        "measured_p50_ms": [c.load.p50_ms for c in checks],
        "throughput": [c.load.throughput for c in checks],
        "offered": [c.load.offered for c in checks],
        "failed": [c.load.failed for c in checks],
        "sent": [c.load.sent for c in checks],
        "median_p99_ms": med,
        "ratio": med / o.queue.p99_ms,
        "holds": med <= 1.25 * o.queue.p99_ms,
        # deploy() read kserve.yaml with kserve's models already (importable here): once is enough
        "files": [c.to_dict() for c in r.checks]
        + ([] if any("kserve.models" in c.tool for c in r.checks) else [kserve.to_dict()]),
        "notes": r.notes,
    }


def _fmt(v, digits=3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not np.isfinite(v):
        return "inf"
    return f"{v:.{digits}g}"


def write(results: list[dict], args, kserve: str) -> None:
    lines = [
        "# deploy: the plan, and the plan measured",
        "",
        f"Machine: {_cpu()}, {os.cpu_count()} logical CPUs (shared with other work), Python "
        f"{platform.python_version()}. Date: {time.strftime('%Y-%m-%d')}. Command: "
        f"`python benchmarks/bench_deploy.py {' '.join(a for a in sys.argv[1:] if a != '--render')}`.",
        "",
        "`deploy()` per model: the search (time budget "
        f"{args.budget:g} s), the server's own cost calibrated against the real server, the plan, "
        "the folder (each file read back by its tool), then the check: the chosen CPU plan served "
        "as planned and driven open-loop (Poisson arrivals at the replica's rate, JSON requests, "
        f"the client on the same cores, {args.seconds:g} s after a 1 s warm-up, at most 2000 "
        f"requests), {args.reps} times with a fresh server each. A plan holds when the median "
        "measured p99 is within 1.25x of the promise.",
        "",
        "| model | target | chosen | plan (replicas × batch, delay, queue) | server ms/request + ms/KB (p99 spread) | request + answer bytes | promised p99 ms | measured p99 ms (each run) | median / promise | answered/s of offered | holds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        c = r["server_cost"]
        each = ", ".join(_fmt(x) for x in r["measured_p99_ms"])
        tput = ", ".join(
            f"{_fmt(t, 4)}/{_fmt(o, 4)}" for t, o in zip(r["throughput"], r["offered"], strict=True)
        )
        lines.append(
            f"| {r['model']} | {r['qps']:g}/s at p99 {r['p99_target_ms']:g} ms | {r['winner']}"
            + (
                f" ({r['winner_ratio']:.2f}x, drop {max(r['winner_drop'], 0):.3g})"
                if r["winner_ratio"]
                else ""
            )
            + f" | {r['replicas']} × {r['max_batch']}, {_fmt(r['max_delay_ms'])} ms, {r['max_queue']}"
            f" | {_fmt(c['per_request_ms'])} + {_fmt(c['per_kb_ms'])} ({_fmt(c['tail_ms'])})"
            f" | {r['request_bytes']} + {r['answer_bytes']} | {_fmt(r['promised_p99_ms'])}"
            f" | {each} | {r['ratio']:.2f} | {tput} | {'yes' if r['holds'] else 'no'} |"
        )
    lines += [
        "",
        "The model alone at batch 1 (ONNX Runtime, this CPU): "
        + "; ".join(
            f"{r['model']} {_fmt(r['model_ms_batch1'])} ms (with the server's cost)"
            for r in results
        )
        + ". Without the server's cost the plan promised far less than was measured (issue 29: "
        "1.67 ms promised, 92 ms measured for a digits CNN at 500/s); with it the promise holds "
        "or misses by the reason the check gives.",
        "",
        "Files, each read by the tool that reads it (`deploy/validate.py`; KServe also through "
        f"{kserve}):",
        "",
        "| model | file | read by | status |",
        "| --- | --- | --- | --- |",
    ]
    for r in results:
        for f in r["files"]:
            lines.append(f"| {r['model']} | {f['file']} | {f['tool']} | {f['status']} |")
    notes = sorted({n for r in results for n in r["notes"]})
    if notes:
        lines += ["", *[f"- note: {n}" for n in notes]]
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "deploy.md").write_text("\n".join(lines) + "\n")
    (HERE / "results" / "deploy.json").write_text(json.dumps(results, indent=1, default=str))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", nargs="+", default=list(TARGETS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--budget", type=float, default=120.0)
    ap.add_argument("--render", action="store_true", help="only rewrite the page from deploy.json")
    args = ap.parse_args()
    if args.render:
        results = json.loads((HERE / "results" / "deploy.json").read_text())
        for r in results:  # (pages written before the files were deduplicated)
            seen = set()
            r["files"] = [f for f in r["files"] if not (f["file"] in seen or seen.add(f["file"]))]
        return write(results, args, "kserve 0.21.0 models + kubernetes 37.0.2")
    if args.quick:
        args.reps, args.seconds, args.budget = 2, 4.0, 30.0
    kserve = _kserve_models()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-deploy-") as tmp:
        for name in args.models:
            print(f"deploying {name}", flush=True)
            results.append(run_model(name, Path(tmp), args.reps, args.seconds, args.budget))
            print(
                json.dumps(
                    {
                        k: results[-1][k]
                        for k in ("model", "promised_p99_ms", "measured_p99_ms", "holds")
                    },
                    default=str,
                ),
                flush=True,
            )
    write(results, args, kserve)


if __name__ == "__main__":
    main()
