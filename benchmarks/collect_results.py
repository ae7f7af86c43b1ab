"""Gather the per-benchmark result pages (benchmarks/results/*.md) into benchmarks/RESULTS.md.

Each benchmark script writes its own page (machine, date, command, medians and spread, ratios to
the peers measured in the same run); this script only concatenates them, in a fixed order, under
one summary, so RESULTS.md never holds numbers that no script produced.

    .venv/bin/python benchmarks/collect_results.py
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent
ORDER = [
    "optimize",
    "quantize",
    "quantize_targets",
    "quantize_unseen",
    "quantize_torchvision",
    "torch_backend",
    "train",
    "batch",
    "advisor",
    "serve",
    "serve_attacks",
    "serve_llm",
    "protect",
    "serve_triton",
    "auto",
    "deploy",
    "llm",
    "llm_decode",
    "gpu",
]
TITLES = {
    "optimize": "graph optimizer (issue: foundation and optimizer)",
    "quantize": "quantization",
    "quantize_targets": "int8 per target CPU format (with and without VNNI)",
    "quantize_unseen": "quantization on architectures the project had not seen",
    "quantize_torchvision": "quantization of full-size torchvision architectures",
    "torch_backend": "PyTorch backend",
    "train": "compression with training: pruning, Deep Compression, QAT, distillation",
    "batch": "batch inference (`modelpress run`): pipeline against its slower stage",
    "advisor": "hardware advisor",
    "serve": "serving under load (modelpress serve, Ray Serve, FastAPI)",
    "serve_attacks": "serving under hostile clients (a control client's latency, the server's memory)",
    "serve_llm": "serving a decoder LLM: 16 streams against one (continuous batching)",
    "auto": "auto: the search against optimize + static int8 by hand and an exhaustive run",
    "serve_triton": "serving beside Triton Inference Server (same model, batching, client)",
    "deploy": "deploy: the plan's promised p99 against the measured one",
    "llm": "decoder LLMs: int4 quality (perplexity, greedy agreement), GGUF import",
    "llm_decode": "decoder LLMs: decode speed against onnxruntime-genai and llama.cpp, batching",
    "gpu": "the GPU paths on an H200, and the advisor's estimates against that GPU",
}


def main() -> None:
    pages = {p.stem: p for p in sorted((HERE / "results").glob("*.md"))}
    names = [n for n in ORDER if n in pages] + [n for n in pages if n not in ORDER]
    parts = [
        "# Benchmark results\n",
        "Every section below is written by a script in `benchmarks/` and copied here by "
        "`benchmarks/collect_results.py`; each names its machine, date and command. Timings come "
        "from a shared 2-core machine: compare variants only within one table (they were measured "
        "in the same run, interleaved), and read medians with their p25–p75 spread.\n",
        "## Contents\n",
        *[f"- {TITLES.get(n, n)}: `benchmarks/results/{n}.md`" for n in names],
        "",
    ]
    for n in names:
        text = pages[n].read_text().strip()
        # demote the page's headings one level so the sections nest under this page
        text = "\n".join("#" + line if line.startswith("#") else line for line in text.splitlines())
        parts += [text, ""]
    (HERE / "RESULTS.md").write_text("\n".join(parts))
    print(f"wrote {HERE / 'RESULTS.md'} from {len(names)} result pages")


if __name__ == "__main__":
    main()
