"""Generation with converted decoders (ONNX Runtime) against transformers' ``generate``."""

from __future__ import annotations

import json

import pytest

from modelpress.cli.main import main
from modelpress.errors import ConversionError, InputError, ModelLoadError, OptionError
from modelpress.runtime.generate import Generator, open_llm

PROMPTS = [
    "The quick brown fox",
    "Once upon a time there was",
    "ONNX Runtime runs",
    "Hello world! How are",
    "Quantization trades a little",
]


def _families():
    from modelpress.zoo.llm import FAMILIES

    return [f for f in FAMILIES if f != "llama"]


def _converted(root, family, level="standard"):
    from modelpress.convert.llm import convert_llm
    from modelpress.zoo.llm import tiny_checkpoint

    ckpt = tiny_checkpoint(root / f"{family}-hf", family, seed=3)
    out = root / f"{family}-{level}-llm"
    try:
        convert_llm(ckpt, output=out, level=level)
    except ConversionError as exc:
        if "is not supported" not in str(exc):
            raise
        pytest.skip(f"convert does not read {family} yet")
    return ckpt, out


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return _converted(tmp_path_factory.mktemp("gen"), "llama")


def _transformers_greedy(ckpt, prompt_ids, n):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    out = []
    for ids in prompt_ids:
        x = torch.tensor([ids])
        with torch.no_grad():
            y = model.generate(
                x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n
            )
        out.append(y[0, len(ids) :].tolist())
    return out


def _check_family(ckpt, folder):
    from transformers import AutoTokenizer

    gen = Generator(folder, threads=1, max_seqs=len(PROMPTS))
    reference_ids = [AutoTokenizer.from_pretrained(str(ckpt))(p)["input_ids"] for p in PROMPTS]
    assert [gen.llm.prompt_ids(p) for p in PROMPTS] == reference_ids
    ours = gen.generate(PROMPTS, max_tokens=32).results
    want = _transformers_greedy(ckpt, reference_ids, 32)
    assert [r.token_ids for r in ours] == want
    return gen, ours


def test_greedy_equals_transformers_and_batched_equals_solo(llama):
    _batched_equals_solo(*_check_family(*llama))


def test_ort_level_left_aligned_cache_equals_transformers_batched_and_solo(tmp_path):
    from modelpress.ir.llm import read_config

    ckpt, folder = _converted(tmp_path, "llama", level="ort")
    assert read_config(folder).kv_layout == "left_aligned"
    gen, batched = _check_family(ckpt, folder)
    _batched_equals_solo(gen, batched)
    gen.scheduler.engine.prefill_chunk = 3  # a prompt in chunks through the left-aligned cache
    chunked = gen.generate(PROMPTS, max_tokens=32).results
    assert [r.token_ids for r in chunked] == [r.token_ids for r in batched]


@pytest.mark.parametrize("level, block", [("standard", 32), ("ort", 32), ("standard", 64)])
def test_int4_rows_get_the_same_logits_batched_as_alone(level, block, llama, tmp_path, monkeypatch):
    """int4 (``MatMulNBits``, activations quantized per block) turns a last-bit difference into
    another token. A folder says whether a row's logits are the same bits in a batch of rows of
    other lengths, joining and leaving, as alone (``batch_invariant``: its cache layout, and its
    own model asked at one row and at two on this CPU), and the engine's logits at every step
    must bear it out: equal where it says so (block 32 on AVX-512), different where it does not
    (block 64 on AVX-512 runs rows in pairs otherwise; AVX2 has a one-row kernel)."""
    import dataclasses

    import numpy as np

    from modelpress.compress.llm import quantize_llm
    from modelpress.runtime.generate import Request, SamplingParams, Scheduler
    from modelpress.runtime.generate import engine as engine_module

    folder = llama[1] if level == "standard" else _converted(tmp_path, "llama", level="ort")[1]
    quantize_llm(folder, tmp_path / "int4", method="rtn", block_size=block, threads=1)
    llm = open_llm(tmp_path / "int4", threads=1)
    assert llm.config.kv_layout == {"standard": "in_place", "ort": "left_aligned"}[level]
    seen: dict[int, list] = {}
    choose = engine_module.choose

    def spy(logits, params, rng, previous):
        seen.setdefault(id(params), []).append(np.array(logits))
        return choose(logits, params, rng, previous)

    monkeypatch.setattr(engine_module, "choose", spy)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (12, 5, 20, 9, 16)]

    def run(max_seqs):
        seen.clear()
        requests = [Request(prompt=p, params=q) for p, q in zip(PROMPTS, params)]
        tokens = [r.token_ids for r in Scheduler(llm, max_seqs=max_seqs).run(requests)]
        return tokens, [seen[id(q)] for q in params]

    solo_tokens, solo = run(1)
    batched_tokens, batched = run(len(PROMPTS))
    for a, b in zip(batched, solo):
        assert len(a) == len(b) > 1
    equal = all(np.array_equal(x, y) for a, b in zip(batched, solo) for x, y in zip(a, b))
    assert llm.batch_invariant == equal, llm.batch_variance()
    if equal:
        assert batched_tokens == solo_tokens
    else:
        assert "lone row" in llm.batch_variance()
    # folders of the standard level written before ``in_place`` append the cache: not invariant
    append = dataclasses.replace(llm.config, kv_layout="append")
    monkeypatch.setattr(llm, "config", append)
    assert not llm.batch_invariant


def _batched_equals_solo(gen, batched):
    solo = [Generator(gen.llm, max_seqs=1).generate(p, max_tokens=32).results[0] for p in PROMPTS]
    assert [r.token_ids for r in batched] == [r.token_ids for r in solo]
    assert [r.text for r in batched] == [r.text for r in solo]


@pytest.mark.slow
@pytest.mark.parametrize("family", _families())
def test_greedy_equals_transformers_for_each_family(tmp_path, family):
    _check_family(*_converted(tmp_path, family))


def test_stream_pieces_make_the_text_and_chat_uses_the_template(llama):
    from transformers import AutoTokenizer

    ckpt, folder = llama
    gen = Generator(folder, threads=1)
    stream = gen.stream("Once upon a time", max_tokens=20)
    text = "".join(stream)
    assert stream.result is not None and text == stream.result.text
    assert stream.token_ids == stream.result.token_ids
    chat = [{"role": "user", "content": "Hello world!"}]
    want = AutoTokenizer.from_pretrained(str(ckpt)).apply_chat_template(
        chat, add_generation_prompt=True, tokenize=True
    )
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    assert gen.llm.prompt_ids(messages=chat) == list(want)


def test_cli_streams_and_writes_the_record(llama, tmp_path, capsys):
    _, folder = llama
    record = tmp_path / "gen.json"
    argv = ["generate", str(folder), "--prompt", PROMPTS[0], "--prompt", PROMPTS[1]]
    argv += ["--no-chat-template", "--max-tokens", "8", "--json", str(record)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    data = json.loads(record.read_text())
    prompts = data["result"]["prompts"]
    assert data["command"] == "generate" and len(prompts) == 2
    assert all(len(p["token_ids"]) == 8 and p["time_to_first_token_s"] > 0 for p in prompts)
    assert out == "".join(p["text"] + "\n" for p in prompts)
    import modelpress

    greedy = modelpress.generate(folder, PROMPTS[:2], max_tokens=8).results  # the façade
    assert [p["token_ids"] for p in prompts] == [r.token_ids for r in greedy]


def test_generate_says_when_an_answer_can_depend_on_the_batch(llama, tmp_path, capsys):
    # blocks of 64: this CPU's int4 kernel may compute a lone row otherwise than rows together
    # (AVX-512 here: rows in pairs); the note says so exactly when the folder finds it
    from modelpress.compress.llm import quantize_llm

    _, folder = llama
    quantize_llm(folder, tmp_path / "b64", method="rtn", block_size=64, threads=1)
    invariant = open_llm(tmp_path / "b64", threads=1).batch_invariant
    argv = ["generate", str(tmp_path / "b64"), "--prompt", PROMPTS[0], "--prompt", PROMPTS[1]]
    argv += ["--no-chat-template", "--max-tokens", "2", "--threads", "1"]
    assert main(argv) == 0
    assert ("lone row" in capsys.readouterr().err) == (not invariant)
    assert main([*argv, "--max-seqs", "1"]) == 0  # one at a time: every answer its solo one
    assert "lone row" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--max-tokens", "0"], "--max-tokens must be an integer of at least 1"),
        (["--temperature", "-1"], "--temperature must be a number >= 0"),
        (["--top-p", "1.5"], "--top-p must be a number in (0, 1]"),
        (["--top-p", "0"], "--top-p must be a number in (0, 1]"),
        (["--max-context", "12"], "context limit of 12 tokens (--max-context)"),
    ],
)
def test_cli_bad_values_get_one_line(llama, capsys, extra, message):
    _, folder = llama
    assert main(["generate", str(folder), "--prompt", PROMPTS[1], *extra]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err


def test_bad_folders_and_files(llama, tmp_path, capsys):
    import shutil

    _, folder = llama
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    (broken / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="tokenizer.json is missing"):
        open_llm(broken)
    assert main(["generate", str(broken), "--prompt", "x"]) == 1
    assert "tokenizer.json is missing" in capsys.readouterr().err
    shutil.copy(folder / "tokenizer.json", broken / "tokenizer.json")
    (broken / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="tokenizer.json: not a valid tokenizer"):
        open_llm(broken)
    chats = tmp_path / "chats.jsonl"
    chats.write_text('[{"role": "user", "content": "hi"}]\n{"messages": 3}\n')
    assert main(["generate", str(folder), "--chat", str(chats)]) == 1
    assert "chats.jsonl:2: expected a list of messages" in capsys.readouterr().err
    gen = Generator(folder)
    with pytest.raises(InputError, match="`prompt` must be a non-empty string"):
        gen.generate("")
    with pytest.raises(OptionError, match="`top_k`"):
        gen.generate("hi", top_k=0)


def test_a_prompt_prefilled_in_chunks_gives_the_same_tokens(llama):
    from modelpress.runtime.generate import Request, SamplingParams, Scheduler

    _, folder = llama
    llm = open_llm(folder, threads=1)
    request = Request(prompt=" ".join(PROMPTS), params=SamplingParams(max_tokens=16))
    whole = Scheduler(llm).run([request])[0]
    chunked = Scheduler(llm)
    chunked.engine.prefill_chunk = 5
    request.request_id += "-chunked"
    assert chunked.run([request])[0].token_ids == whole.token_ids


def test_slots_reused_after_requests_leave_give_the_solo_tokens(llama):
    """Rows leave at different steps and waiting requests take their places in the store's
    buffers, which ONNX Runtime writes each step's cache into: every answer equals its solo run,
    and the empty batch keeps no buffer."""
    from modelpress.runtime.generate import Request, SamplingParams, Scheduler

    _, folder = llama
    llm = open_llm(folder, threads=1)
    lengths = [3, 9, 5, 12, 7]
    requests = [
        Request(prompt=p, params=SamplingParams(max_tokens=n, ignore_eos=True))
        for p, n in zip(PROMPTS, lengths)
    ]
    scheduler = Scheduler(llm, max_seqs=2)
    engine, decoder = scheduler.engine, llm.decoder
    written = []

    def spy(*args, present=None):
        out = decoder(*args, present=present)
        if args[0].shape[1] == 1:  # a decode step (a prompt is prefilled alone, not in place)
            written.append(present is not None and out[1][0] is present[0][0])
        return out

    spy.writes_present = True
    engine.decoder = spy
    batched = scheduler.run(requests)
    solo = [Scheduler(llm, max_seqs=1).run([r])[0] for r in requests]
    assert [r.token_ids for r in batched] == [r.token_ids for r in solo]
    assert [len(r.token_ids) for r in batched] == lengths
    assert written and all(written)  # every decode step wrote its present in place
    assert engine.cache.rows == 0 and engine.cache.store.reserved_bytes() == 0


@pytest.mark.slow  # the CPU's roofs are measured: about a minute here
def test_advise_measures_an_llm_folder_beside_its_estimate(llama, tmp_path, capsys):
    _, folder = llama
    record = tmp_path / "advise.json"
    assert main(["advise", str(folder), "--seq", "16", "--json", str(record)]) == 0
    out = capsys.readouterr().out
    assert "prefill, 16 tokens" in out and "decode, a token" in out
    llm = json.loads(record.read_text())["result"]["llm"]
    assert llm["prompt_tokens"] == 16 and llm["prefill_ms"] > 0 and llm["decode_ms"] > 0
    assert llm["predicted_prefill_ms"] > 0 and llm["predicted_decode_ms"] > 0
    assert llm["decode_predicted_over_measured"] == llm["predicted_decode_ms"] / llm["decode_ms"]
    assert main(["advise", str(folder), "--seq", "300"]) == 1  # over the context of 256
    err = capsys.readouterr().err
    assert err.startswith("error: --seq 300 + 32 generated tokens") and "context of 256" in err
