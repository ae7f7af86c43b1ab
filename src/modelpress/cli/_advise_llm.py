"""``modelpress advise`` on an LLM folder: prefill and decode measured on this CPU beside the
estimate of its graph."""

from __future__ import annotations

from modelpress.cli._common import console
from modelpress.errors import OptionError
from modelpress.ir.llm import read_config


def advise_llm(args, recorder) -> int:
    """An LLM folder: prefill and decode measured on this CPU beside the estimate of its graph."""
    from modelpress.advisor.llm_measured import calibrate_llm

    prompt = args.seq or 256
    tokens = min(args.gen_tokens, 32)
    context = read_config(args.model).max_context
    if prompt + tokens > context:
        raise OptionError(
            f"--seq {prompt} + {tokens} generated tokens is over the model's context of {context}"
        )
    with console.status(f"measuring {args.model} on this CPU"):
        cal = calibrate_llm(args.model, prompt_tokens=prompt, gen_tokens=tokens)
    console.print(
        f"{args.model} on {cal.cpu} ({cal.threads} threads): matmul {cal.matmul_gflops:.1f} "
        f"GFLOP/s, copy {cal.copy_gbs:.1f} GB/s, {cal.node_overhead_us:.2f} µs a node"
    )
    rows = [
        (f"prefill, {prompt} tokens", cal.prefill),
        (f"decode, a token ({cal.decode_tokens_per_s:.1f}/s)", cal.decode),
    ]
    console.print(f"{'':28} {'measured ms':>20} {'estimate ms':>11} {'est/meas':>9}")
    for name, phase in rows:
        ms, (lo, hi), est = phase.measured_ms, phase.range_ms, phase.predicted_ms
        spread = f"({lo:.0f}-{hi:.0f})"
        console.print(
            f"{name:28} {ms:>9.1f} {spread:>10} {est:>11.1f} {est / ms:>9.2f}  {phase.bound}"
        )
    console.print(
        f"median of {cal.runs} runs, {tokens} greedy tokens each; the estimate is the decoder "
        "graph's roofline on the roof measured above. For GPUs, give the checkpoint's config.json."
    )
    recorder.write({"llm": cal.to_dict()})
    return 0
