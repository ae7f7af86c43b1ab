"""modelpress generate LLM_DIR --prompt TEXT | --chat FILE.jsonl: text from a decoder LLM folder.

Generate text with an LLM folder written by `modelpress convert`: greedy or sampled, the model's
chat template, stop strings, tokens streamed as they come.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from modelpress.cli import options
from modelpress.cli._common import err_console
from modelpress.cli.options import Recorder, add_record, require_positive, speaks_flags
from modelpress.errors import InputError, OptionError

EPILOG = """\
Without --temperature, --top-k or --top-p the decoding is greedy. A --prompt goes through the
model's chat template as a user message (when the model has one) unless --no-chat-template is
given. --chat FILE.jsonl holds one conversation a line: a JSON list of {"role", "content"}
messages, or {"messages": [...]}. Several prompts run together (continuous batching); the text of
each is streamed to stdout in turn, and a line of numbers per prompt goes to stderr.

examples:
  modelpress generate smollm2/ --prompt "What is the capital of France?"
  modelpress generate smollm2/ --prompt "Once upon a time" --no-chat-template --max-tokens 64
  modelpress generate smollm2/ --chat chats.jsonl --temperature 0.7 --top-p 0.9 --seed 1 --json out.json
"""

FLAGS = {
    "messages": "--chat",
}


def add_parser(sub) -> None:
    p = options.add_command(
        sub,
        "generate",
        __doc__,
        help="generate text with a decoder LLM folder (greedy or sampled, streamed)",
        epilog=EPILOG,
    )
    p.add_argument("model", metavar="LLM_DIR", help="an LLM folder (modelpress_llm.json, ...)")
    p.add_argument(
        "--prompt", action="append", default=[], metavar="TEXT", help="a prompt (repeatable)"
    )
    p.add_argument(
        "--chat", metavar="FILE.jsonl", help="conversations, one JSON list of messages a line"
    )
    p.add_argument(
        "--no-chat-template",
        action="store_true",
        help="give --prompt to the model as it is, not as a user message of the chat template",
    )
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=128, metavar="N", help="default 128")
    g.add_argument(
        "--temperature", type=float, metavar="T", help="sample at this temperature (0: greedy)"
    )
    g.add_argument("--top-k", type=int, metavar="K", help="sample from the K most likely tokens")
    g.add_argument(
        "--top-p", type=float, metavar="P", help="sample from the most likely tokens up to mass P"
    )
    g.add_argument(
        "--repetition-penalty",
        type=float,
        metavar="X",
        help="divide the logits of tokens already seen by X (transformers' rule)",
    )
    g.add_argument("--seed", type=int, metavar="N", help="seed of the sampling (reproducible)")
    g.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="stop when the text contains TEXT, left out of the output (repeatable)",
    )
    r = p.add_argument_group("runtime")
    r.add_argument("--threads", type=int, metavar="N", help="intra-op threads (default: all cores)")
    options.add_with_default(
        r, "--max-seqs", type=int, default=8, metavar="N", help="prompts run at once"
    )
    r.add_argument(
        "--max-context",
        type=int,
        metavar="N",
        help="refuse a prompt whose tokens plus --max-tokens exceed N (default: the model's)",
    )
    r.add_argument("--quiet", action="store_true", help="print nothing but errors")
    add_record(p)
    p.set_defaults(func=run)


def read_chats(path: str) -> list[list[dict]]:
    """The conversations of a .jsonl file; ``InputError`` naming the file and line."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: cannot read ({exc.__class__.__name__})") from None
    chats = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{p}:{n}: not valid JSON ({exc.msg})") from None
        if isinstance(item, dict):
            item = item.get("messages")
        if not isinstance(item, list) or not item:
            raise InputError(f'{p}:{n}: expected a list of messages or {{"messages": [...]}}')
        chats.append(item)
    if not chats:
        raise InputError(f"{p}: no conversations")
    return chats


@speaks_flags(fields=FLAGS)
def run(args) -> int:
    from modelpress.runtime.generate import (
        GenerateResult,
        Request,
        SamplingParams,
        Scheduler,
        open_llm,
    )

    if bool(args.prompt) == bool(args.chat):
        raise OptionError("give --prompt TEXT (repeatable) or --chat FILE.jsonl")
    require_positive(args.threads, "--threads")
    sampling = ("max_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "seed")
    params = SamplingParams(**options.keywords(args, *sampling), stop=tuple(args.stop))
    chats = read_chats(args.chat) if args.chat else None
    recorder = Recorder("generate", args)
    llm = open_llm(args.model, threads=args.threads)
    scheduler = Scheduler(llm, max_seqs=args.max_seqs, max_context=args.max_context)
    if chats is not None:
        requests = [Request(messages=m, params=params) for m in chats]
    elif args.no_chat_template or llm.chat_template is None:
        requests = [Request(prompt=t, params=params) for t in args.prompt]
    else:
        requests = [
            Request(messages=[{"role": "user", "content": t}], params=params) for t in args.prompt
        ]
    why = llm.batch_variance() if len(requests) > 1 and args.max_seqs > 1 else None
    if why:
        err_console.print(
            f"note: a greedy answer decoded beside others can differ from the same prompt alone: "
            f"{why}"
        )
    start = time.perf_counter()
    results = _stream(scheduler, requests, quiet=args.quiet)
    result = GenerateResult(str(llm.folder), results, params, time.perf_counter() - start)
    recorder.write(result.to_dict())
    return 0


def _stream(scheduler, requests, *, quiet: bool):
    """Run ``requests`` together; print each one's text in turn, the current one as it comes."""
    pieces: dict[str, list[str]] = {r.request_id: [] for r in requests}
    results: dict[str, object] = {}

    def sink(event) -> None:
        pieces[event.request_id].append(event.text)
        if event.result is not None:
            results[event.request_id] = event.result

    for r in requests:  # all checked before any is run
        scheduler.prepare(r)
    for r in requests:
        scheduler.add(r, sink)
    for i, r in enumerate(requests):
        if not quiet and len(requests) > 1:
            err_console.print(f"[bold]── {i + 1}/{len(requests)}[/bold]")
        shown = 0
        while True:
            text = "".join(pieces[r.request_id][shown:])
            shown = len(pieces[r.request_id])
            if text and not quiet:
                sys.stdout.write(text)
                sys.stdout.flush()
            if r.request_id in results:
                break
            scheduler.step()
        done = results[r.request_id]
        if not quiet:
            sys.stdout.write("\n")
            sys.stdout.flush()
            tps = f"{done.tokens_per_s:.1f} tok/s" if done.tokens_per_s else "- tok/s"
            ttft = done.time_to_first_token_s or 0.0
            err_console.print(
                f"[dim]{done.prompt_tokens} prompt + {done.completion_tokens} tokens "
                f"({done.finish_reason}), first token {ttft * 1000:.0f} ms, {tps}[/dim]"
            )
    return [results[r.request_id] for r in requests]
