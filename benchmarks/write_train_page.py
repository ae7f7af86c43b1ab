"""The page ``benchmarks/results/train.md`` from ``train.json`` (written by ``bench_train.py``)."""

from __future__ import annotations


def _ms(lat: dict, batch) -> str:
    t = lat.get(str(batch)) or lat.get(batch)
    return f"{t['median']:.3f} ({t['p25']:.3f}-{t['p75']:.3f})" if t else "-"


def page(data: dict) -> str:
    out = ["# Compression with training (prune, Deep Compression, QAT, distillation)", ""]
    out += [f"Machine: {data.get('machine', '?')}; a shared 2-core x86 machine with other jobs running (timings are noisy: compare within a table). Dates: {data.get('dates', {})}.", ""]
    out += ["Command: `.venv/bin/python benchmarks/bench_train.py` (`make bench` installs the peer, torch-pruning 1.6.1).", ""]
    if "prune" in data:
        out += ["## Structured pruning, 50% of the channels (digits CNNs)", "",
                "Accuracy on the digits test split (450 images; one image is 0.22 points): the median of 3 seeds (shuffling and split), each seed in brackets. Latency: ONNX Runtime, all optimizations, one thread, ms per call, median (p25-p75), every variant interleaved in one process. Fine-tuning: 3 epochs, Adam 3e-3, cosine, batch 32, for every variant (Torch-Pruning trains its PyTorch module in train mode).", "",
                "| model | variant | accuracy | params | size KiB | ms batch 1 | ms batch 8 | b8 vs original | train s |",
                "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        base = {}
        for r in data["prune"]:
            if r["variant"] == "original":
                base[r["model"]] = r
            b = base[r["model"]]
            ratio = r["latency"]["8"]["median"] / b["latency"]["8"]["median"] if "8" in r["latency"] else None
            secs = f"{r['seconds']:.0f}" if r.get("seconds") else "-"
            seeds = " (" + ", ".join(f"{a:.1%}" for a in r["accuracies"]) + ")" if len(r.get("accuracies", [])) > 1 else ""
            out.append(f"| {r['model']} | {r['variant']} | {r['accuracy']:.2%}{seeds} | {r['params']:,} | {r['size'] / 1024:.1f} | {_ms(r['latency'], 1)} | {_ms(r['latency'], 8)} | {ratio:.2f}x | {secs} |")
        out.append("")
    if "deep" in data:
        out += ["## Deep Compression (5-bit shared weights; 90% sparsity, mobilenet-digits 80%)", "",
                "Size after each stage as Han et al. count it (pruned: 32-bit values + 8-bit relative index per kept weight; shared: 5 bits + index + codebooks; then the `.mpz` file itself, zstd-coded), against the float32 ONNX file. Accuracy of the model decoded from the `.mpz`.", "",
                "| model | float32 | pruned | + shared | + entropy coded (.mpz) | accuracy before → after |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for r in data["deep"]:
            st = r["stages"]
            cells = [f"{s['bytes'] / 1024:.1f} KiB ({s['ratio']:.1f}x)" for s in st]
            out.append(f"| {r['model']} ({r['sparsity']:.0%}) | {' | '.join(cells)} | {r['accuracy_before']:.2%} → {r['accuracy_after']:.2%} |")
        out.append("")
    if "qat" in data:
        out += ["## Quantization-aware training against post-training quantization", "",
                "Same 512 training images for calibration and QAT (int8: 1 epoch, Adam 1e-4; w4a8: 2 epochs, Adam 3e-4; the float model as teacher plus labels). w4a8: weights on 16 levels (int8 containers), activations uint8, on static mode's graph.", "",
                "| model | float | static int8 (PTQ) | QAT int8 | w4a8 rounded (PTQ) | QAT w4a8 | QAT graph = static graph |", "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
        for r in data["qat"]:
            out.append(f"| {r['model']} | {r['float']:.2%} | {r['static int8']:.2%} | {r['QAT int8']:.2%} | {r['w4a8 (round to nearest)']:.2%} | {r['QAT w4a8']:.2%} | {r['same_structure']} |")
        out.append("")
    if "distill" in data:
        out += ["## Distillation (resnet-digits teacher, 0.5-width student made by width reduction)", "", "| variant | accuracy | params | train s |", "| --- | ---: | ---: | ---: |"]
        for r in data["distill"]:
            seeds = " (" + ", ".join(f"{a:.1%}" for a in r["accuracies"]) + ")" if len(r.get("accuracies", [])) > 1 else ""
            out.append(f"| {r['variant']} | {r['accuracy']:.2%}{seeds} | {r['params']:,} | {r.get('seconds', 0):.0f} |")
        out.append("")
    if "minilm" in data:
        r = data["minilm"][0]
        out += ["## MiniLM (all-MiniLM-L6-v2): 50% of FFN neurons and a third of the heads pruned, then distilled", "",
                f"Training: {r['sentences'][0]} sentences from Python's standard-library docstrings, sequence {r['seq']}; held out: {r['sentences'][1]} other sentences. Cosine: mean cosine similarity of each held-out sentence embedding to the original model's.", "",
                "| | params | size MiB | cosine | ms batch 1 | ms batch 8 |", "| --- | ---: | ---: | ---: | ---: | ---: |",
                f"| original | {r['params'][0]:,} | {r['size'][0] / 2**20:.1f} | 1 | {_ms(r['latency']['original'], 1)} | {_ms(r['latency']['original'], 8)} |",
                f"| pruned, before training | | | {r['cosine_pruned_only']:.4f} | | |",
                f"| pruned + distilled | {r['params'][1]:,} | {r['size'][1] / 2**20:.1f} | {r['cosine_distilled']:.4f} | {_ms(r['latency']['pruned + distilled'], 1)} | {_ms(r['latency']['pruned + distilled'], 8)} |", ""]
    return "\n".join(out) + "\n"
