"""Model protection: encryption throughput, latency and load time of protected models against the
originals, and the protection measured at three obfuscation ratios.

    .venv/bin/python benchmarks/bench_protect.py            # everything (several minutes)
    .venv/bin/python benchmarks/bench_protect.py --quick    # fewer rounds, no MiniLM

Models come from ``modelpress.zoo`` (built into ``benchmarks/_work/``): resnet-digits and
mobilenet-digits (CNNs), bert-tiny and minilm (transformers, MiniLM being the real
all-MiniLM-L6-v2 weights).

* throughput: sealing and opening a 256 MiB payload in memory (``package.encrypt_stream`` /
  ``decrypt_stream``, 1 MiB chunks) against AES-256-GCM alone on the same chunks (the peer: what
  the cipher costs without the format), and writing/opening MiniLM's package on disk;
* latency: ONNX Runtime on the CPU (all optimizations, one process, the global thread pool),
  the original against the storage-mode package and runtime-mode packages at ratios 0.1/0.3/0.6,
  interleaved round by round; median and p25-p75 in ms, ratio to the original's median;
* load time: from the file to a session that has run once (``ir.load`` + session for the
  original; ``open_package`` + session for the packages), median of interleaved repeats;
* protection at ratios 0.1/0.3/0.6 (``metrics.py``, from the obfuscated file alone);
* recovery: each runtime-mode package (ratio 0.1) opened with its key and given to ONNX Runtime's
  optimizer (BASIC, EXTENDED, ALL), the ONNX inliner, onnxsim and onnxslim
  (``tests/protect/recovery.py``): the largest |Spearman r| of an original weight with any
  tensor of the result against the chance level for its size, and the share of op types left at
  their original count;
* memory: peak RSS of ``protect`` (encrypt, obfuscate; the check after it included) and of
  opening a package, each in a fresh process, on a wide MLP built by code
  (``benchmarks/protect_memory.py``; ``--memory-mib``, 1100 by default: over 1 GB).

Writes ``benchmarks/results/protect.md`` and ``protect.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime

from modelpress import zoo
from modelpress.ir import load
from modelpress.protect import open_package, package, protect
from modelpress.runtime.measure import time_interleaved
from modelpress.runtime.ort import session, use_global_thread_pool

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "tests" / "protect"))  # recovery.py: the attack, shared
WORK = ROOT / "_work"
RESULTS = ROOT / "results"
RATIOS = (0.1, 0.3, 0.6)
SEQ = {"bert-tiny": 32, "minilm": 32}


def _cpu() -> dict:
    info = {"model": platform.processor() or platform.machine(), "flags": []}
    try:
        text = Path("/proc/cpuinfo").read_text()
        for line in text.splitlines():
            if line.startswith("model name"):
                info["model"] = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                info["flags"] = sorted(
                    flags
                    & {
                        "aes",
                        "vaes",
                        "pclmulqdq",
                        "vpclmulqdq",
                        "avx2",
                        "avx512f",
                        "avx512_vnni",
                        "avx_vnni",
                    }
                )
                break
    except OSError:
        pass
    return info


def _quantiles(samples) -> dict:
    q = np.percentile(np.asarray(samples), [25, 50, 75])
    return {"p25": float(q[0]), "median": float(q[1]), "p75": float(q[2])}


# -- throughput ---------------------------------------------------------------------------------


def bench_throughput(key: bytes, repeats: int) -> dict:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    size, chunk = 256 << 20, package.DEFAULT_CHUNK
    data = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes()
    view = memoryview(data)
    sealed = package.encrypt_bytes(data, key, kind=package.KIND_MODEL)
    aead = AESGCM(key)
    out = bytearray(chunk + 16)

    def raw_gcm():
        for i in range(0, size, chunk):
            aead.encrypt_into(i.to_bytes(12, "big"), view[i : i + chunk], b"", out)

    def seal():
        package.encrypt_stream([data], size, key, lambda b: None, chunk_size=chunk)

    def unseal():
        for _ in package.decrypt_stream(sealed, key):
            pass

    fns = {
        "AES-256-GCM alone (peer)": raw_gcm,
        "seal (.mpk format)": seal,
        "open (.mpk format)": unseal,
    }
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    rows = {}
    for name, ts in times.items():
        mbps = [size / 1e6 / t for t in ts]
        rows[name] = _quantiles(mbps)
    peer = rows["AES-256-GCM alone (peer)"]["median"]
    for row in rows.values():
        row["ratio_to_peer"] = row["median"] / peer
    return {"payload_mib": size >> 20, "chunk_bytes": chunk, "repeats": repeats, "rows": rows}


def bench_disk(key: bytes, path: Path, repeats: int) -> dict:
    size = path.stat().st_size
    out = WORK / "throughput.mpk"
    seal, opened = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        protect(path, key=key, output=out, verify=False)
        seal.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        open_package(out, key)
        opened.append(time.perf_counter() - t0)
    out.unlink()
    return {
        "model": path.name,
        "bytes": size,
        "protect_mbps": _quantiles([size / 1e6 / t for t in seal]),
        "open_mbps": _quantiles([size / 1e6 / t for t in opened]),
    }


# -- latency, load time, metrics ----------------------------------------------------------------


def _packages(name: str, path: Path, key: bytes) -> tuple[dict, dict]:
    """The variants' package files and the protect results (metrics) per ratio."""
    files = {"original": path}
    results = {}
    files["encrypted"] = WORK / f"{name}.enc.mpk"
    protect(path, key=key, output=files["encrypted"], verify=False)
    files["storage"] = WORK / f"{name}.storage.mpk"
    protect(
        path,
        key=key,
        output=files["storage"],
        obfuscate=True,
        mode="storage",
        ratio=0.3,
        seed=0,
        verify=False,
    )
    for ratio in RATIOS:
        f = WORK / f"{name}.runtime{ratio}.mpk"
        t0 = time.perf_counter()
        r = protect(path, key=key, output=f, obfuscate=True, mode="runtime", ratio=ratio, seed=0)
        results[ratio] = {"seconds": time.perf_counter() - t0, "result": r}
        files[f"runtime {ratio}"] = f
    return files, results


def _open(path: Path, key: bytes):
    return load(path) if path.suffix == ".onnx" else open_package(path, key)


def bench_latency(
    name: str, files: dict, key: bytes, batches, rounds: int, blocks: int = 5
) -> list[dict]:
    """Interleaved timings in ``blocks`` separate blocks: a burst of load from other jobs on the
    shared machine then spoils one block's ratios, not the result (ratios are medians over blocks)."""
    sessions = {label: session(_open(f, key)) for label, f in files.items() if label != "encrypted"}
    rows = []
    for batch in batches:
        feeds = zoo.sample_inputs(name, batch=batch, seq=SEQ.get(name))
        fns = [lambda s=s, f=feeds: s.run(None, f) for s in sessions.values()]
        per_block = [
            time_interleaved(fns, runs=max(rounds // blocks, 3), warmup=3) for _ in range(blocks)
        ]
        for i, label in enumerate(sessions):
            medians = [b[i].median_ms for b in per_block]
            ratios = [b[i].median_ms / b[0].median_ms for b in per_block]
            rows.append(
                {
                    "model": name,
                    "batch": batch,
                    "variant": label,
                    "median_ms": float(np.median(medians)),
                    "min_ms": min(medians),
                    "max_ms": max(medians),
                    "ratio": float(np.median(ratios)),
                    "ratio_min": min(ratios),
                    "ratio_max": max(ratios),
                    "runs": sum(b[i].runs for b in per_block),
                }
            )
    return rows


def bench_load(name: str, files: dict, key: bytes, repeats: int) -> list[dict]:
    feeds = zoo.sample_inputs(name, batch=1, seq=SEQ.get(name))
    labels = ["original", "encrypted", "storage", "runtime 0.3"]
    times: dict[str, list[float]] = {k: [] for k in labels}
    for _ in range(repeats):
        for label in labels:
            t0 = time.perf_counter()
            s = session(_open(files[label], key))
            s.run(None, feeds)
            times[label].append(time.perf_counter() - t0)
    base = float(np.median(times["original"]))
    return [
        {
            "model": name,
            "variant": k,
            **{f"{q}_s": v for q, v in _quantiles(ts).items()},
            "ratio": float(np.median(ts)) / base,
        }
        for k, ts in times.items()
    ]


def _md_table(header: list[str], rows: list[list]) -> list[str]:
    lines = [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join(["---"] + ["---:"] * (len(header) - 1)) + " |",
    ]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return lines


def bench_recovery(name: str, path: Path, key: bytes) -> list[dict]:
    import onnx
    import recovery

    package = WORK / f"{name}.recovery.mpk"
    protect(path, key=key, output=package, obfuscate=True, ratio=0.1, verify=False)
    original = onnx.load(str(path))
    weights = recovery.original_weights(original)
    rows = []
    results = recovery.tool_results(open_package(package, key))
    for tool, result in results.items():
        worst = recovery.worst_correlation(weights, result, family=len(results))
        rows.append(
            {
                "model": name,
                "tool": tool,
                "r": worst["r"],
                "threshold": worst["threshold"],
                "elements": worst["n"],
                "same_count_share": recovery.same_count_share(original, result),
            }
        )
    package.unlink()
    return rows


def bench_memory(mib: int, key: bytes) -> list[dict]:
    import protect_memory

    folder = WORK / "memory"
    folder.mkdir(exist_ok=True)
    # built in a process of its own: this one stays small (a child's peak starts from nothing)
    model = folder / "mlp.onnx"
    subprocess.run(
        [sys.executable, protect_memory.__file__, "build", str(model), "--mib", str(mib)],
        check=True,
    )
    size = (folder / "mlp.onnx.data").stat().st_size
    key_file = folder / "key.bin"
    key_file.write_bytes(key)
    rows = []
    for step, source, out in (
        ("encrypt", model, folder / "enc.mpk"),
        ("open", folder / "enc.mpk", None),
        ("obfuscate", model, folder / "obf.mpk"),
        ("open", folder / "obf.mpk", None),
        ("storage", model, folder / "sto.mpk"),
        ("open", folder / "sto.mpk", None),
    ):
        print(f"memory: {step} {source.name}…", flush=True)
        r = protect_memory.measure(source, step, key_file, out, size)
        rows.append({**r, "source": source.name})
    for f in folder.iterdir():
        f.unlink()
    return rows


def write_report(report: dict) -> None:
    m, t = report["machine"], report["throughput"]
    lines = [
        "# Model protection: encryption and obfuscation",
        "",
        f"Machine: {m['cpu']['model']}, {m['cores']} CPU cores (shared with other jobs), CPU flags {', '.join(m['cpu']['flags'])}; "
        f"onnxruntime {m['onnxruntime']}, cryptography {m['cryptography']}, Python {m['python']}. Date: {report['date']}.",
        "",
        f"Command: `.venv/bin/python benchmarks/bench_protect.py{' --quick' if report['quick'] else ''}`",
        "",
        "## Encryption throughput",
        "",
        f"A {t['payload_mib']} MiB payload in memory, {t['chunk_bytes'] >> 10} KiB chunks, {t['repeats']} interleaved repeats; "
        "MB/s median (p25-p75). The peer is AES-256-GCM alone on the same chunks (what the cipher costs without the format's "
        "header, nonces, bound chunk indices and buffering).",
        "",
    ]
    lines += _md_table(
        ["step", "MB/s", "p25-p75", "vs AES-GCM alone"],
        [
            [
                k,
                f"{v['median']:.0f}",
                f"{v['p25']:.0f}-{v['p75']:.0f}",
                f"{v['ratio_to_peer']:.2f}x",
            ]
            for k, v in t["rows"].items()
        ],
    )
    d = report["disk"]
    lines += [
        "",
        f"On disk, {d['model']} ({d['bytes'] / 1e6:.0f} MB): `protect` (read, seal, write atomically) "
        f"{d['protect_mbps']['median']:.0f} MB/s, `open_package` (read, check, decrypt into the model's tensors) "
        f"{d['open_mbps']['median']:.0f} MB/s (medians).",
        "",
        "## Latency after load (ONNX Runtime, CPU)",
        "",
        *(
            [
                f"Measured {report['models_date']} (with load time, protection and recovery below): "
                "`.venv/bin/python benchmarks/bench_protect.py --models-only`; the sections above "
                f"and the memory one are from {report['date']}.",
                "",
            ]
            if report.get("models_date")
            else []
        ),
        "ms per call: the median of 5 blocks' medians (the blocks' range); within a block all variants run interleaved, "
        "round by round, in one process on the global thread pool, ORT's optimizations on. `vs original`: the median over "
        "blocks of each block's ratio to the original (range). `storage`: the obfuscated package, opened (the original restored in memory); `runtime R`: the obfuscated graph "
        "itself runs (ratio R of its anonymous nodes carry a decoy and an opaque predicate). A plain encrypted package opens "
        "to the original model itself, so its latency is the original's.",
        "",
    ]
    lines += _md_table(
        ["model", "batch", "variant", "ms", "range", "vs original", "range"],
        [
            [
                r["model"],
                r["batch"],
                r["variant"],
                f"{r['median_ms']:.3f}",
                f"{r['min_ms']:.3f}-{r['max_ms']:.3f}",
                f"{r['ratio']:.3f}x",
                f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}",
            ]
            for r in report["latency"]
        ],
    )
    lines += [
        "",
        "## Load time",
        "",
        "From the file to a session that has run once; seconds, median (p25-p75) of interleaved repeats.",
        "",
    ]
    lines += _md_table(
        ["model", "variant", "s", "p25-p75", "vs original"],
        [
            [
                r["model"],
                r["variant"],
                f"{r['median_s']:.3f}",
                f"{r['p25_s']:.3f}-{r['p75_s']:.3f}",
                f"{r['ratio']:.2f}x",
            ]
            for r in report["load"]
        ],
    )
    lines += [
        "",
        "## The protection, measured",
        "",
        "From the obfuscated file alone (`protect/metrics.py`): the share of compute nodes with an anonymous op type; the "
        "op-type histogram distance to the original's under the best matching of types (0: the counts give the "
        "architecture away); node and edge counts against the original's; the largest |Pearson correlation| between any "
        "stored tensor and any original weight of the same size (pairs compared); original names (5+ characters) found "
        "in the file's bytes. `protect s`: the whole `protect` call, verification included.",
        "",
    ]
    lines += _md_table(
        [
            "model",
            "ratio",
            "anonymous",
            "hist. distance",
            "nodes",
            "edges",
            "max corr (pairs)",
            "names found",
            "protect s",
        ],
        [
            [
                r["model"],
                r["ratio"],
                f"{100 * r['anonymous_share']:.0f}%",
                f"{r['op_histogram_distance']:.2f}",
                f"{r['nodes']} / {r['original_nodes']} ({100 * r['node_change']:+.0f}%)",
                f"{r['edges']} / {r['original_edges']} ({100 * r['edge_change']:+.0f}%)",
                f"{r['max_weight_correlation']:.4f} ({r['weight_pairs']})",
                f"{len(r['names_found'])} of {r['names_checked']}",
                f"{r['seconds']:.1f}",
            ]
            for r in report["metrics"]
        ],
    )
    if report.get("recovery"):
        lines += [
            "",
            "## Recovery with the standard tools (runtime mode, ratio 0.1)",
            "",
            "Each package opened with its key; ONNX Runtime's optimizer at each level (its optimized graph saved, the "
            "run-time values given), the ONNX inliner, onnxsim and onnxslim (on the model as its library decrypts, the "
            "run-time values being no part of it). `r`: the largest |Spearman r| (rank correlation) between an original "
            "weight (16 elements or more, in any axis order) and any tensor of the result of the same size; `chance`: the "
            "level chance reaches for that size with probability 1e-3 over the pairs compared with the package, every "
            "tool's result included (normal approximation, Bonferroni); `same count`: the share of the original's op "
            "types found at their original count."
            + (
                f" Recovery measured {report['recovery_date']}."
                if report.get("recovery_date")
                else ""
            ),
            "",
        ]
        lines += _md_table(
            ["model", "tool", "r", "chance", "elements", "same count"],
            [
                [
                    r["model"],
                    r["tool"],
                    f"{r['r']:.4f}",
                    f"{r['threshold']:.4f}",
                    r["elements"],
                    f"{r['same_count_share']:.2f}",
                ]
                for r in report["recovery"]
            ],
        )
    if report.get("memory"):
        lines += [
            "",
            "## Memory (a wide MLP built by code)",
            "",
            "Peak RSS of each step in a fresh process (`VmHWM`; `ru_maxrss` would keep the parent's peak across fork and exec), less the process's RSS once its imports are done, "
            "as a multiple of the model's file size. `encrypt`, `obfuscate` (runtime mode) and `storage` (obfuscation "
            "in storage mode) are `protect` on the ONNX file, the check after it included (the original run, then the "
            "package opened and run against it); `open`: `open_package` of the package the step before wrote, an ONNX "
            "Runtime session on it and one run. One process at a time (`benchmarks/protect_memory.py`).",
            "",
            f"Command: `.venv/bin/python benchmarks/bench_protect.py --memory-only --memory-mib 1100`; "
            f"date: {report.get('memory_date', report['date'])}."
            + (f" {report['memory_note']}" if report.get("memory_note") else ""),
            "",
        ]
        lines += _md_table(
            ["step", "file", "model MiB", "peak MiB", "over baseline", "x model"],
            [
                [
                    r["step"],
                    r["source"],
                    f"{r.get('model_mib', 0):.0f}",
                    f"{r.get('peak_mib', 0):.0f}",
                    f"{r.get('peak_mib', 0) - r.get('baseline_mib', 0):.0f}",
                    f"{r['ratio']:.2f}x" if "ratio" in r else r.get("error", "?"),
                ]
                for r in report["memory"]
            ],
        )
    lines += ["", *report["summary"], ""]
    (RESULTS / "protect.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "protect.json").write_text(json.dumps(report, indent=2, default=str) + "\n")


def summarize(report: dict) -> list[str]:
    t = report["throughput"]["rows"]
    worst = min(t["seal (.mpk format)"]["median"], t["open (.mpk format)"]["median"])
    lines = ["**Targets.**", ""]
    lines.append(
        f"- Throughput >= 500 MB/s for sealing and opening: {'met' if worst >= 500 else 'NOT met'} (slower of the two: {worst:.0f} MB/s in memory)."
    )
    storage = [r for r in report["latency"] if r["variant"] == "storage"]
    clean = [r for r in storage if r["ratio_max"] - r["ratio_min"] <= 0.1]  # blocks that agree
    noisy = [r for r in storage if r["ratio_max"] - r["ratio_min"] > 0.1]
    agree = ", ".join("{} b{} {:.3f}x".format(r["model"], r["batch"], r["ratio"]) for r in clean)
    line = (
        f"- Storage mode <= 2% over the original after load: {'met' if all(r['ratio'] <= 1.02 for r in clean) else 'NOT met'} "
        f"where the blocks agree ({agree})"
    )
    if noisy:
        spread = ", ".join(
            "{} b{} {:.3f}x, blocks {:.2f}-{:.2f}".format(
                r["model"], r["batch"], r["ratio"], r["ratio_min"], r["ratio_max"]
            )
            for r in noisy
        )
        line += f"; where they do not, the spread is the machine's ({spread})"
    lines.append(line + ". Storage mode runs the original graph itself.")
    for ratio in RATIOS:
        b8 = [
            r for r in report["latency"] if r["variant"] == f"runtime {ratio}" and r["batch"] == 8
        ]
        within = [f"{r['model']} {r['ratio']:.3f}x" for r in b8]
        ok = all(r["ratio"] <= 1.10 for r in b8)
        lines.append(
            f"- Runtime mode <= 10% at batch 8, ratio {ratio}: {'met' if ok else 'not met on every model'} ({', '.join(within)})."
        )
    load = {(r["model"], r["variant"]): r for r in report["load"]}
    runtime_load = ", ".join(
        "{} {:.2f} s vs {:.2f} s".format(
            m, load[(m, "runtime 0.3")]["median_s"], load[(m, "original")]["median_s"]
        )
        for m in dict.fromkeys(r["model"] for r in report["load"])
    )
    lines.append(
        "- Load time (reported; no target): a plain package opens about as fast as the ONNX file; runtime mode pays "
        f"for the weights' decoding, which ONNX Runtime folds once when the session is made ({runtime_load})."
    )
    big = [r for r in report["metrics"] if r["ratio"] == 0.6]
    ok = all(
        r["anonymous_share"] >= 0.9
        and abs(r["node_change"]) >= 0.3
        and r["max_weight_correlation"] < 0.05
        and not r["names_found"]
        for r in big
    )
    lines.append(
        f"- Ratio 0.6 on CNNs and transformers (>= 90% anonymous, node count +-30%, correlation < 0.05, no name): {'met on every model' if ok else 'NOT met'}."
    )
    rec = report.get("recovery") or []
    if rec:
        ok = all(r["r"] < r["threshold"] and r["same_count_share"] < 0.10 for r in rec)
        lines.append(
            f"- Recovery with ORT's optimizer (3 levels), the inliner, onnxsim, onnxslim: no weight above chance and < 10% of op types at their counts: {'met on every model and tool' if ok else 'NOT met everywhere'} ({len(rec)} model-tool pairs)."
        )
    mem = [r for r in report.get("memory") or [] if "ratio" in r]
    if mem:
        each = ", ".join(f"{r['step']} {r['source']} {r['ratio']:.1f}x" for r in mem)
        ok = all(r["ratio"] <= 3.0 for r in mem)
        lines.append(
            f"- Memory <= 3x the model ({mem[0]['model_mib']:.0f} MiB): {'met' if ok else 'NOT met for every step'} ({each})."
        )
    return lines


MODELS = ("resnet-digits", "mobilenet-digits", "bert-tiny", "minilm")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, no MiniLM")
    parser.add_argument(
        "--memory-mib", type=int, default=1100, help="size of the memory benchmark's model (MiB)"
    )
    parser.add_argument(
        "--memory-only", action="store_true", help="measure memory only, into protect.json's report"
    )
    parser.add_argument(
        "--models-only",
        action="store_true",
        help="measure the models only (latency, load, protection, recovery) into protect.json's "
        "report, keeping its throughput and memory",
    )
    parser.add_argument(
        "--recovery-only",
        action="store_true",
        help="measure recovery only, into protect.json's report",
    )
    parser.add_argument(
        "--rewrite",
        action="store_true",
        help="rewrite protect.md from protect.json, measuring nothing",
    )
    args = parser.parse_args()
    if args.memory_only:
        report = json.loads((RESULTS / "protect.json").read_text())
        WORK.mkdir(exist_ok=True)
        report["memory"] = bench_memory(args.memory_mib, os.urandom(32))
        report["memory_date"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        report["summary"] = summarize(report)
        write_report(report)
        print("\n".join(report["summary"]))
        return
    if args.recovery_only:
        report = json.loads((RESULTS / "protect.json").read_text())
        WORK.mkdir(exist_ok=True)
        key = os.urandom(32)
        names = sorted({r["model"] for r in report.get("recovery", [])}, key=MODELS.index)
        report["recovery"] = [
            row
            for name in names
            for row in bench_recovery(name, zoo.build(name, WORK / f"{name}.onnx"), key)
        ]
        report["recovery_date"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        report["summary"] = summarize(report)
        write_report(report)
        return
    if args.rewrite:
        report = json.loads((RESULTS / "protect.json").read_text())
        report["summary"] = summarize(report)
        write_report(report)
        return
    WORK.mkdir(exist_ok=True)
    RESULTS.mkdir(exist_ok=True)
    key = os.urandom(32)
    previous = json.loads((RESULTS / "protect.json").read_text()) if args.models_only else None
    names = list(MODELS[:3]) + ([] if args.quick else [MODELS[3]])
    paths = {n: zoo.build(n, WORK / f"{n}.onnx") for n in names}
    recovered = []
    for name in names:  # before the global thread pool: onnxsim makes sessions of its own
        print(f"{name}: recovery…", flush=True)
        recovered += bench_recovery(name, paths[name], key)
    use_global_thread_pool()
    import cryptography

    report: dict = {
        "date": dt.date.today().isoformat(),
        "quick": args.quick,
        "machine": {
            "cpu": _cpu(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__,
            "cryptography": cryptography.__version__,
        },
    }
    if previous is not None:  # measured before, by the full run: kept with its own date
        report["models_date"] = report["date"]
        for k in ("date", "quick", "throughput", "disk"):
            report[k] = previous[k]
    else:
        print("throughput…", flush=True)
        report["throughput"] = bench_throughput(key, repeats=3 if args.quick else 7)
        disk_model = paths.get("minilm", paths["bert-tiny"])
        report["disk"] = bench_disk(key, disk_model, repeats=2 if args.quick else 3)
    report["latency"], report["load"], report["metrics"] = [], [], []
    for name in names:
        print(f"{name}: protecting…", flush=True)
        files, results = _packages(name, paths[name], key)
        for ratio, r in results.items():
            report["metrics"].append(
                {
                    "model": name,
                    "ratio": ratio,
                    "seconds": r["seconds"],
                    **r["result"].metrics.to_dict(),
                }
            )
        print(f"{name}: latency…", flush=True)
        heavy = name == "minilm"
        rounds = (15 if heavy else 60) if args.quick else (40 if heavy else 300)
        report["latency"] += bench_latency(name, files, key, (1, 8), rounds)
        print(f"{name}: load…", flush=True)
        report["load"] += bench_load(name, files, key, repeats=3 if heavy or args.quick else 7)
        for label, f in files.items():
            if label != "original":
                f.unlink()
    report["recovery"] = recovered
    if previous is not None:
        report["memory"] = previous.get("memory", [])
        report["memory_date"] = previous.get("memory_date")
    else:
        report["memory"] = bench_memory(args.memory_mib, key)
        report["memory_date"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    report["summary"] = summarize(report)
    write_report(report)
    print("\n".join(report["summary"]))
    print(f"wrote {RESULTS / 'protect.md'}")


if __name__ == "__main__":
    main()
