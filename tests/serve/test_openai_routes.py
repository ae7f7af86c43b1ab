"""``modelpress serve LLM_DIR`` talked to by the official ``openai`` client, on 127.0.0.1.

The LLM is a tiny random-weight Llama (``zoo.llm.tiny_checkpoint``) converted to an LLM folder;
greedy answers are checked against transformers' ``generate`` on the checkpoint itself, streamed
answers against the same request not streamed, concurrent answers against each one alone.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx  # the HTTP client the openai package is built on
import openai
import pytest
from serve_testing import ROOT, ServerProcess

PROMPTS = [
    "The quick brown fox",
    "Once upon a time there was",
    "ONNX Runtime runs",
    "Hello world! How are",
    "Quantization trades a little",
    "A language model predicts",
    "The lazy dog",
    "Speed and memory",
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from modelpress.convert.llm import convert_llm
    from modelpress.zoo.llm import tiny_checkpoint

    root = tmp_path_factory.mktemp("llm")
    ckpt = tiny_checkpoint(root / "hf", "llama", seed=3)
    folder = root / "tiny"
    convert_llm(ckpt, output=folder)
    return ckpt, folder


@pytest.fixture(scope="module")
def server(checkpoint):
    srv = ServerProcess([str(checkpoint[1]), "--max-seqs", "16"])
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://{server.url}/v1", api_key="none", max_retries=0)


def _transformers_greedy(ckpt, prompt: str, n: int) -> tuple[str, int]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ckpt))
    model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    x = torch.tensor([tok(prompt)["input_ids"]])
    with torch.no_grad():
        y = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n)
    new = y[0, x.shape[1] :].tolist()
    return tok.decode(new, skip_special_tokens=True), len(new)


def test_models_and_a_greedy_completion_equal_transformers(client, checkpoint):
    (card,) = client.models.list().data
    assert card.id == "tiny" and card.owned_by == "modelpress"
    r = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12, temperature=0)
    text, count = _transformers_greedy(checkpoint[0], PROMPTS[0], 12)
    assert r.choices[0].text == text
    assert r.usage.completion_tokens == count
    assert r.usage.total_tokens == r.usage.prompt_tokens + count
    assert r.choices[0].finish_reason == ("length" if count == 12 else "stop")


@pytest.mark.parametrize("chat", [False, True])
def test_streamed_and_not_streamed_answers_are_identical(client, chat):
    common = dict(model="tiny", max_tokens=24, seed=7, temperature=0.8, top_p=0.9)
    if chat:
        messages = [{"role": "user", "content": PROMPTS[1]}]
        whole = client.chat.completions.create(messages=messages, **common)
        stream = client.chat.completions.create(
            messages=messages, stream=True, stream_options={"include_usage": True}, **common
        )
        text_of, whole_text = (lambda c: c.delta.content or ""), whole.choices[0].message.content
    else:
        whole = client.completions.create(prompt=PROMPTS[1], **common)
        stream = client.completions.create(
            prompt=PROMPTS[1], stream=True, stream_options={"include_usage": True}, **common
        )
        text_of, whole_text = (lambda c: c.text), whole.choices[0].text
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(text_of(choice))
            finish = choice.finish_reason or finish
    assert "".join(pieces) == whole_text and whole_text
    assert finish == whole.choices[0].finish_reason
    assert usage.model_dump() == whole.usage.model_dump()


def test_stop_strings_end_the_answer_before_them(client):
    full = client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=30).choices[0]
    stop = full.text[5:8]
    assert len(stop) == 3
    cut = client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=30, stop=[stop])
    assert cut.choices[0].text == full.text[: full.text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_sixteen_concurrent_greedy_requests_each_get_their_solo_answer(client):
    prompts = PROMPTS * 2
    lengths = [8 + 3 * (i % 5) for i in range(16)]  # sequences join and leave at different steps

    def ask(i: int) -> str:
        r = client.completions.create(
            model="tiny", prompt=prompts[i], max_tokens=lengths[i], temperature=0
        )
        return r.choices[0].text

    solo = [ask(i) for i in range(16)]
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(ask, range(16)))
    assert together == solo


def _status_of(exc: openai.APIStatusError) -> tuple[int, str | None, str]:
    error = exc.body if isinstance(exc.body, dict) else {}
    return exc.status_code, error.get("param"), error.get("message", "")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": "high"}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"seed": -1}, "seed"),
        ({"n": 2}, "n"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"logprobs": 2}, "logprobs"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": [10**9]}, "prompt"),
    ],
)
def test_bad_values_are_400_naming_the_field(client, fields, param):
    body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 4, **fields}
    with pytest.raises(openai.BadRequestError) as info:
        client.post("/completions", body=body, cast_to=httpx.Response)
    status, named, message = _status_of(info.value)
    assert status == 400 and named == param and message


def test_a_prompt_past_the_context_is_400_naming_the_limit(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="hello " * 400, max_tokens=4)
    status, param, message = _status_of(info.value)
    assert status == 400 and param == "prompt" and "context is 256 tokens" in message
    assert info.value.body["code"] == "context_length_exceeded"
    # room for the prompt, not for max_tokens: the limit named too
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=1000)
    assert "256" in info.value.body["message"]
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="other", prompt=PROMPTS[0], max_tokens=4)
    assert info.value.body["param"] == "model"


def test_metrics_hold_time_to_first_token_inter_token_latency_and_tokens(server, client):
    client.completions.create(model="tiny", prompt=PROMPTS[3], max_tokens=6, temperature=0)
    m = server.metric
    assert m('modelpress_llm_time_to_first_token_seconds_count{model="tiny"}') >= 1
    assert m('modelpress_llm_inter_token_latency_seconds_count{model="tiny"}') >= 1
    assert m('modelpress_llm_tokens_per_second_count{model="tiny"}') >= 1
    assert m('modelpress_llm_generated_tokens_total{model="tiny"}') >= 6
    assert m('modelpress_request_failures_total{code="400",model="tiny"}') >= 1


def test_a_client_that_disconnects_frees_its_slot(checkpoint):
    srv = ServerProcess([str(checkpoint[1]), "--max-seqs", "1"])
    try:
        body = {
            "model": "tiny",
            "prompt": PROMPTS[0],
            "max_tokens": 240,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", f"http://{srv.url}/v1/completions", json=body) as r:
                assert r.status_code == 200
                got = []
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        got.append(json.loads(line[6:]))
                    if len(got) == 3:
                        break
            # the response is closed: the server sees the client gone
        deadline = time.monotonic() + 30
        metric = 'modelpress_llm_requests_finished_total{model="tiny",reason="cancelled"}'
        while srv.metric(metric) < 1:
            assert time.monotonic() < deadline, "the stream was not cancelled"
            time.sleep(0.05)
        # the same without streaming: the client sends its request and goes away at once
        payload = json.dumps({**body, "stream": False}).encode()
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            s.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(payload) + payload
            )
        while srv.metric(metric) < 2:
            assert time.monotonic() < deadline + 30, "the request was not cancelled"
            time.sleep(0.05)
        # the one slot serves the next request (240 tokens of the old ones would take far longer)
        client = openai.OpenAI(base_url=f"http://{srv.url}/v1", api_key="none", timeout=60)
        r = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=4)
        assert r.usage.completion_tokens >= 1
        generated = srv.metric('modelpress_llm_generated_tokens_total{model="tiny"}')
        assert generated < 2 * 240
    finally:
        assert srv.stop() == 0


# What ``modelpress serve LLM_DIR`` runs needs none of these (the folder's decoder goes to ONNX
# Runtime as a file): loaded, onnx_ir alone (with sympy and onnx) was a third of the server's
# resident memory before its first model byte.
HEAVY = ("onnx_ir", "onnx", "sympy", "torch", "transformers", "tensorflow")

# the real command in a child process; once it listens, one completion and one chat request,
# then the modules it holds, then SIGTERM (the server drains and the command returns)
_CHILD = """
import json, os, signal, sys, threading, urllib.request
import modelpress.serve.server as server
from modelpress.cli.main import main

real, seen = server.serve, {}


def ask(host, port):
    try:
        for route, body in (
            ("completions", {"prompt": "The lazy dog"}),
            ("chat/completions", {"messages": [{"role": "user", "content": "Hello"}]}),
        ):
            data = json.dumps({"model": "tiny", "max_tokens": 3, **body}).encode()
            headers = {"Content-Type": "application/json"}
            req = urllib.request.Request(f"http://{host}:{port}/v1/{route}", data, headers)
            seen[route] = json.loads(urllib.request.urlopen(req, timeout=60).read())["usage"]
        seen["heavy"] = sorted(m for m in sys.argv[2].split(",") if m in sys.modules)
    finally:
        os.kill(os.getpid(), signal.SIGTERM)


def serve(*args, on_started, **kwargs):
    def started(host, port):
        on_started(host, port)
        threading.Thread(target=ask, args=(host, port)).start()

    return real(*args, on_started=started, **kwargs)


server.serve = serve
code = main(["serve", sys.argv[1], "--port", "0"])
print("SEEN", json.dumps(seen), code)
"""


def test_serving_an_llm_folder_loads_no_graph_tools_nor_torch(checkpoint):
    """The whole command (parser, folder, app, two requests) in a fresh process: none of HEAVY
    is imported (each would be loaded before anything else if a module on the path imported it)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(checkpoint[1]), ",".join(HEAVY)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("SEEN "))
    seen, code = line[5:].rsplit(" ", 1)
    seen = json.loads(seen)
    assert code == "0"
    assert seen["completions"]["completion_tokens"] >= 1, seen
    assert seen["chat/completions"]["completion_tokens"] >= 1, seen
    assert seen["heavy"] == [], f"the LLM server imported {seen['heavy']}"
