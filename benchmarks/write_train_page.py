"""The page ``benchmarks/results/train.md`` from ``train.json`` (written by ``bench_train.py``)."""

from __future__ import annotations


def _ms(lat: dict, batch) -> str:
    t = lat.get(str(batch)) or lat.get(batch)
    return f"{t['median']:.3f} ({t['p25']:.3f}-{t['p75']:.3f})" if t else "-"


def page(data: dict) -> str:
    out = ["# Compression with training (prune, Deep Compression, QAT, distillation)", ""]
    out += [
        f"Machine: {data.get('machine', '?')}; a shared 2-core x86 machine with other jobs running (timings are noisy: compare within a table). Dates: {data.get('dates', {})}.",
        "",
    ]
    out += [
        "Command: `.venv/bin/python benchmarks/bench_train.py` (`make bench` installs the peer, torch-pruning 1.6.1).",
        "",
    ]
    if "prune" in data:
        out += [
            "## Structured pruning, 50% of the channels (digits CNNs)",
            "",
            "Accuracy on the digits test split (450 images; one image is 0.22 points): the median of 3 seeds (shuffling and split), each seed in brackets. Latency: ONNX Runtime, all optimizations, one thread, ms per call, median (p25-p75), every variant interleaved in one process. Fine-tuning: 3 epochs, Adam 3e-3, cosine, batch 32, for every variant (Torch-Pruning trains its PyTorch module in train mode). Channels ranked by modelpress's default importance (`activation`: the weights that read a channel times its RMS on the data) and by Torch-Pruning's group L1 (filters, BatchNorm scales, reading columns).",
            "",
            "Before fine-tuning: the test accuracy of the selection alone (seed 0), right after pruning with the BatchNorm statistics measured again on 512 training images (Torch-Pruning's too), no training: what the ranking of the channels leaves to recover.",
            "",
            "| model | variant | before fine-tuning | accuracy | params | size KiB | ms batch 1 | ms batch 8 | b8 vs original | train s |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        base = {}
        for r in data["prune"]:
            if r["variant"] == "original":
                base[r["model"]] = r
            b = base[r["model"]]
            ratio = (
                r["latency"]["8"]["median"] / b["latency"]["8"]["median"]
                if "8" in r["latency"]
                else None
            )
            secs = f"{r['seconds']:.0f}" if r.get("seconds") else "-"
            seeds = (
                " (" + ", ".join(f"{a:.1%}" for a in r["accuracies"]) + ")"
                if len(r.get("accuracies", [])) > 1
                else ""
            )
            before = f"{r['before_training']:.2%}" if r.get("before_training") is not None else "-"
            out.append(
                f"| {r['model']} | {r['variant']} | {before} | {r['accuracy']:.2%}{seeds} | {r['params']:,} | {r['size'] / 1024:.1f} | {_ms(r['latency'], 1)} | {_ms(r['latency'], 8)} | {ratio:.2f}x | {secs} |"
            )
        out.append("")
    if "deep" in data:
        out += [
            "## Deep Compression (5-bit shared weights)",
            "",
            "Size after each stage as Han et al. count it, against the float32 ONNX file: the graph optimized (BatchNorm folded into the convs, Pads fused, constants folded), pruned (32-bit values + 8-bit relative index per kept weight), shared (5 bits + index + 32-bit codebooks), then the `.mpz` file itself (zstd-coded; codebooks and biases in float16, trained so). Retraining: 4 epochs after pruning (Adam 1e-2, cosine, labels + the original as teacher), 4 for the codebooks (1e-3). Accuracy of the model decoded from the `.mpz` on the digits test split (450 images; one image is 0.22 points).",
            "",
            "| model | float32 | graph optimized | pruned | + shared | + entropy coded (.mpz) | accuracy before → after |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in data["deep"]:
            cells = [f"{s['bytes'] / 1024:.1f} KiB ({s['ratio']:.1f}x)" for s in r["stages"]]
            out.append(
                f"| {r['model']} ({r['sparsity']:.0%}) | {' | '.join(cells)} | {r['accuracy_before']:.2%} → {r['accuracy_after']:.2%} |"
            )
        parts = ("header", "model", "side", "codebooks", "gaps", "masks", "codes")
        out += [
            "",
            "Bytes of each part of the `.mpz` (`model`: the graph without its weights and the tensor table; `side`: biases and other unshared tensors in float16; `gaps`/`masks`: kept positions, per layer whichever is smaller).",
            "",
            "| model | " + " | ".join(parts) + " | total |",
            "| --- |" + " ---: |" * (len(parts) + 1),
        ]
        for r in data["deep"]:
            out.append(
                f"| {r['model']} ({r['sparsity']:.0%}) | "
                + " | ".join(f"{r['parts'].get(p, 0):,}" for p in parts)
                + f" | {sum(r['parts'].values()):,} |"
            )
        out.append("")
    if "qat" in data:
        out += [
            "## Quantization-aware training against post-training quantization",
            "",
            "Same 512 training images for calibration and QAT (int8: 1 epoch, Adam 1e-4; w4a8: 2 epochs, Adam 3e-4; the float model as teacher plus labels). w4a8: weights on 16 levels (int8 containers), activations uint8, on static mode's graph.",
            "",
            "| model | float | static int8 (PTQ) | QAT int8 | w4a8 rounded (PTQ) | QAT w4a8 | QAT graph = static graph |",
            "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for r in data["qat"]:
            out.append(
                f"| {r['model']} | {r['float']:.2%} | {r['static int8']:.2%} | {r['QAT int8']:.2%} | {r['w4a8 (round to nearest)']:.2%} | {r['QAT w4a8']:.2%} | {r['same_structure']} |"
            )
        out.append("")
    if "distill" in data:
        out += [
            "## Distillation (resnet-digits teacher, 0.5-width students)",
            "",
            "Accuracy on the digits test split (450 images; one image is 0.22 points): mean ± standard deviation over 10 seeds (shuffling, held-out split, and the random student's weights), each variant of a student with the same seeds, student, steps, Adam 3e-3 (cosine), batch 32 and data. "
            "Distilled: `distill`'s defaults, labels + the teacher's outputs (KL at T=4, alpha 0.5) + the CNN's stage outputs through a 1x1 projection (least-squares start). "
            "vs labels only: the paired difference in points (distilled minus labels only, seed by seed), mean ± standard error, and the seeds better / equal / worse.",
            "",
            "| teacher | student | epochs | variant | accuracy | vs labels only | params | train s |",
            "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |",
        ]
        for r in data["distill"]:
            if r["variant"] == "teacher":
                out.append(
                    f"| {r.get('teacher', '')} | (the teacher itself) | | | {r['accuracy']:.2%} | | {r['params']:,} | |"
                )
                continue
            p = r.get("vs_labels")
            vs = (
                f"{p['mean']:+.2f} ± {p['se']:.2f} ({p['better']}/{p['same']}/{p['worse']})"
                if p
                else ""
            )
            out.append(
                f"| {r.get('teacher', '')} | {r.get('student', '')} | {r.get('epochs', '')} | {r['variant']} | {r['accuracy']:.2%} ± {r.get('std', 0) * 100:.2f} | {vs} | {r['params']:,} | {r.get('seconds', 0):.0f} |"
            )
        out.append("")
    if "minilm" in data:
        r = data["minilm"][0]
        out += [
            "## MiniLM (all-MiniLM-L6-v2): 50% of FFN neurons and a third of the heads pruned, then distilled",
            "",
            f"Training: {r['sentences'][0]} sentences from the docstrings of Python's standard library, sequence {r['seq']}, {r.get('epochs', 1)} epoch(s); held out: {r['sentences'][1]} other sentences. Cosine: mean cosine similarity of each held-out sentence embedding to the original model's.",
            "",
            "| | params | size MiB | cosine | ms batch 1 | ms batch 8 |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
            f"| original | {r['params'][0]:,} | {r['size'][0] / 2**20:.1f} | 1 | {_ms(r['latency']['original'], 1)} | {_ms(r['latency']['original'], 8)} |",
            *(
                [
                    f"| pruned, units chosen by weight norms (L1), before training | | | {r['cosine_pruned_l1']:.4f} | | |"
                ]
                if "cosine_pruned_l1" in r
                else []
            ),
            *(
                [
                    f"| pruned, units chosen by {r['importance']} + least-squares refit, a ratio per layer, before training | | | {r['cosine_pruned_per_layer']:.4f} | | |"
                ]
                if "cosine_pruned_per_layer" in r
                else []
            ),
            f"| pruned{', units chosen by ' + r['importance'] + (' + least-squares refit' if r.get('refit') else '') + (', ranked across layers' if r.get('global_ranking') else '') if 'importance' in r else ''}, before training | | | {r['cosine_pruned_only']:.4f} | | |",
            f"| pruned + distilled | {r['params'][1]:,} | {r['size'][1] / 2**20:.1f} | {r['cosine_distilled']:.4f} | {_ms(r['latency']['pruned + distilled'], 1)} | {_ms(r['latency']['pruned + distilled'], 8)} |",
            "",
        ]
    out += _targets(data)
    return "\n".join(out) + "\n"


def _targets(data: dict) -> list[str]:
    """The issue's targets against the numbers above, each said plainly."""
    lines = ["## Targets", ""]
    if "prune" in data:
        rows = data["prune"]
        for model in sorted({r["model"] for r in rows}):
            by = {r["variant"]: r for r in rows if r["model"] == model}
            base, lab = by["original"], by["modelpress, labels"]
            nol, peer = (
                by["modelpress, no labels (teacher)"],
                by["Torch-Pruning (PyTorch source), labels"],
            )
            ratio = lab["latency"]["8"]["median"] / base["latency"]["8"]["median"]
            drop_l = (base["accuracy"] - lab["accuracy"]) * 100
            drop_n = (base["accuracy"] - nol["accuracy"]) * 100
            gap = (peer["accuracy"] - lab["accuracy"]) * 100
            lines.append(
                f"- {model}, 50% of the channels: latency at batch 8 {ratio:.2f}x of the original (target <= 0.6x: {'met' if ratio <= 0.6 else 'not met'}); "
                f"accuracy drop {drop_l:+.2f} points with labels (<= 1: {'met' if drop_l <= 1 else 'not met'}), {drop_n:+.2f} without (<= 1.5: {'met' if drop_n <= 1.5 else 'not met'}); "
                f"Torch-Pruning on the PyTorch source of the same network reaches {gap:+.2f} points more (no worse than it: {'met' if gap <= 0 else 'not met'}; the pruned architectures are the same, so is their latency)."
            )
    if "deep" in data:
        for r in data["deep"]:
            ratio = r["stages"][-1]["ratio"]
            drop = (r["accuracy_before"] - r["accuracy_after"]) * 100
            lines.append(
                f"- Deep Compression, {r['model']} at {r['sparsity']:.0%}: {ratio:.1f}x smaller, accuracy {-drop:+.2f} points (target >= 10x at <= 1 point: {'met' if ratio >= 10 and drop <= 1 else 'not met'})."
            )
    if "qat" in data:
        for r in data["qat"]:
            for ptq, qat, fmt in (
                ("static int8", "QAT int8", "int8"),
                ("w4a8 (round to nearest)", "QAT w4a8", "w4a8"),
            ):
                loss = (r["float"] - r[ptq]) * 100
                rec = (r[qat] - r[ptq]) * 100
                if loss >= 1:
                    verdict = f"post-training loses {loss:.2f} points, QAT recovers {rec:.2f} ({'met' if rec >= loss / 2 else 'not met'}: at least half)"
                else:
                    verdict = f"post-training loses {loss:.2f} points (under 1: nothing to recover), QAT {rec:+.2f} ({'never below post-training: met' if rec >= 0 else 'below post-training: not met'})"
                lines.append(f"- QAT {fmt}, {r['model']}: {verdict}.")
    if "distill" in data:
        rows = data["distill"]
        teachers = {r.get("teacher"): r["accuracy"] for r in rows if r["variant"] == "teacher"}
        for r in rows:
            p = r.get("vs_labels")
            if r["variant"] != "distilled" or not p:
                continue
            t = teachers[r.get("teacher")]
            shown = p["mean"] - 2 * p["se"] > 0
            lines.append(
                f"- Distillation, teacher {r.get('teacher')}, student {r['student']}, {r['epochs']} epochs: {(r['accuracy'] - t) * 100:+.2f} points against the teacher on average (within 2 of it: {'met' if t - r['accuracy'] <= 0.02 else 'not met'}); "
                f"against the same student on labels alone {p['mean']:+.2f} ± {p['se']:.2f} points, paired over the seeds "
                f"(better: {'met, by more than two standard errors' if shown else 'not shown' if p['mean'] > 0 else 'not met'})."
            )
    if "minilm" in data:
        r = data["minilm"][0]
        ratio = (
            r["latency"]["pruned + distilled"]["8"]["median"]
            / r["latency"]["original"]["8"]["median"]
        )
        lines.append(
            f"- MiniLM, half the FFN neurons and a third of the heads: latency {ratio:.2f}x at batch 8 (<= 0.7x: {'met' if ratio <= 0.7 else 'not met'}); "
            f"mean cosine {r['cosine_distilled']:.3f} after distillation (>= 0.97: {'met' if r['cosine_distilled'] >= 0.97 else 'not met'}; "
            f"the pruned model starts at {r['cosine_pruned_only']:.3f})."
        )
    return lines + [""]
