"""OpenAI-compatible routes for decoder LLMs, on ``runtime.generate``'s continuous batching.

| route | answer |
| --- | --- |
| ``GET /v1/models`` | the LLMs served (``{"object": "list", "data": [{"id", "object": "model", ...}]}``) |
| ``POST /v1/completions`` | a completion of ``prompt`` (a string, or token ids) |
| ``POST /v1/chat/completions`` | the assistant's answer to ``messages`` (the model's chat template) |

Both generation routes answer as one JSON document, or with ``"stream": true`` as server-sent
events (``data: {chunk}`` lines, then ``data: [DONE]``), with ``usage`` (prompt, completion and
total tokens) in the document, or in a last chunk when ``stream_options.include_usage`` is set.
Fields: ``max_tokens`` (``max_completion_tokens``), ``temperature`` (0 to 2), ``top_p``, ``seed``,
``stop`` (a string or up to 4), ``n`` (1 only), ``presence_penalty``/``frequency_penalty`` (0
only), ``stream``, ``stream_options``; and, as vLLM takes them, ``top_k``,
``repetition_penalty`` and ``ignore_eos``. Fields the server cannot honour (``logprobs``,
``tools``, ``response_format`` other than text, ``echo``, ``best_of``, ``logit_bias``) are refused
rather than ignored; unknown fields are ignored, as OpenAI's own clients add some.

Errors are OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``: 400 for a bad
field (``param`` names it), a prompt longer than the context (``code``
``context_length_exceeded``, the message names the limit), 404 for an unknown model. Without
``max_tokens``, a completion makes 16 tokens (OpenAI's default) and a chat answer runs to the end
of the context. A stream whose client goes away is cancelled: its slot is free at the next step.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.requests import ClientDisconnect

from modelpress.errors import ModelpressError
from modelpress.runtime.generate import Request as GenerationRequest
from modelpress.runtime.generate import SamplingParams, Scheduler
from modelpress.runtime.generate.chat import check_messages
from modelpress.serve.body import read_body
from modelpress.serve.errors import RequestError, json_object, logged

COMPLETION_DEFAULT_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_STOP = 4  # OpenAI's limit
UNSUPPORTED = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "functions": (None, []),
    "suffix": (None, ""),
}


class OpenAIError(RequestError):
    """A refusal in OpenAI's error shape; ``param`` names the field."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code=None):
        super().__init__(status, message)
        self.param = param
        self.code = code

    def body(self) -> bytes:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return json.dumps(
            {
                "error": {
                    "message": self.message,
                    "type": kind,
                    "param": self.param,
                    "code": self.code,
                }
            }
        ).encode()


def _fail(exc: RequestError) -> Response:
    if not isinstance(exc, OpenAIError):
        exc = OpenAIError(exc.status, exc.message)
    return Response(exc.body(), status_code=exc.status, media_type="application/json")


_FIELD = re.compile(r"`([A-Za-z_\[\]0-9.]+)`")


def _from_library(exc: ModelpressError) -> OpenAIError:
    """A refusal of the generation library (it names fields in backquotes, as the API does)."""
    message = str(exc)
    found = _FIELD.search(message)
    param = found.group(1) if found else None
    code = "context_length_exceeded" if "context limit" in message else None
    return OpenAIError(400, message.replace("`", "'"), param=param, code=code)


# --- reading a request ----------------------------------------------------------------------


def _number(body: dict, name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise OpenAIError(400, f"'{name}' must be a number from {low:g} to {high:g}", param=name)
    return float(value)


def _integer(body: dict, name: str, low: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise OpenAIError(400, f"'{name}' must be an integer of at least {low}", param=name)
    return value


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stops, list)
        or len(stops) > MAX_STOP
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise OpenAIError(
            400, f"'stop' must be a string or a list of up to {MAX_STOP} strings", param="stop"
        )
    return tuple(stops)


def _refuse_unsupported(body: dict) -> None:
    for name, harmless in UNSUPPORTED.items():
        if name in body and body[name] not in harmless:
            raise OpenAIError(400, f"'{name}' is not supported by this server", param=name)
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise OpenAIError(
                400, f"'{name}' is not supported (use repetition_penalty)", param=name
            )
    if _integer(body, "n", 1) not in (None, 1):
        raise OpenAIError(400, "'n' must be 1: one choice per request", param="n")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise OpenAIError(400, "'response_format' must be text", param="response_format")


def _params(body: dict, *, default_tokens: int) -> SamplingParams:
    _refuse_unsupported(body)
    max_tokens = _integer(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 1)
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise OpenAIError(400, "'ignore_eos' must be true or false", param="ignore_eos")
    try:
        return SamplingParams(
            max_tokens=max_tokens if max_tokens is not None else default_tokens,
            temperature=_number(body, "temperature", 0, 2),
            top_p=_number(body, "top_p", 0, 1),
            top_k=_integer(body, "top_k", 1),
            repetition_penalty=_number(body, "repetition_penalty", 0, 1e6),
            seed=_integer(body, "seed", 0),
            stop=_stops(body),
            ignore_eos=ignore_eos,
        )
    except ModelpressError as exc:
        raise _from_library(exc) from None


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise OpenAIError(400, f"'{name}' must be true or false", param=name)
    return value


def _include_usage(body: dict) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise OpenAIError(400, "'stream_options' must be an object", param="stream_options")
    return _flag(options, "include_usage")


def _prompt_ids(llm, body: dict) -> list[int]:
    """The token ids of a completion's ``prompt``: a string, token ids, or a list of one."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return llm.prompt_ids(prompt)
    vocab = llm.config.vocab_size
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in prompt)
    ):
        return list(prompt)
    raise OpenAIError(
        400,
        f"'prompt' must be one non-empty string or a list of token ids from 0 to {vocab - 1}",
        param="prompt",
    )


def _messages(body: dict) -> list[dict]:
    """``messages`` with each content as text (a list of text parts is joined)."""
    messages = body.get("messages")
    try:
        check_messages(messages)
    except ModelpressError as exc:
        raise _from_library(exc) from None
    out = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise OpenAIError(
                        400,
                        f"'messages[{i}].content': only text parts are supported",
                        param=f"messages[{i}].content",
                    )
                parts.append(str(part.get("text", "")))
            content = "".join(parts)
        out.append({**m, "content": content})
    return out


# --- the routes -----------------------------------------------------------------------------


class LLMService:
    """One LLM behind the server: its scheduler, its name, when it was loaded."""

    def __init__(self, name: str, scheduler: Scheduler):
        self.name = name
        self.scheduler = scheduler
        self.created = int(time.time())

    def model_card(self) -> dict:
        return {
            "id": self.name,
            "object": "model",
            "created": self.created,
            "owned_by": "modelpress",
        }


def open_services(llms: list[tuple[str, object]], options, metrics) -> dict[str, LLMService]:
    """A scheduler per ``(name, LLM)`` (``runtime.generate.open_llm``), within ``options``'
    ``max_seqs`` and ``max_context``, reporting to ``metrics`` (not started yet)."""
    from modelpress.errors import OptionError
    from modelpress.runtime.generate import GenerationMetrics

    metrics.add_llm()
    services = {}
    for name, llm in llms:
        hooks = GenerationMetrics(
            on_time_to_first_token=metrics.ttft.labels(name).observe,
            on_inter_token_latency=metrics.itl.labels(name).observe,
            on_step=_step(metrics.running.labels(name)),
            on_finished=_finished(metrics, name),
        )
        try:
            scheduler = Scheduler(
                llm,
                max_seqs=options.max_seqs,
                max_context=options.max_context,
                metrics=hooks,
                prefill_chunk=options.prefill_chunk,
            )
        except OptionError as exc:
            limit = llm.config.max_context
            raise OptionError(
                f"--max-context {options.max_context}: {name!r} takes 1 to {limit} tokens"
            ) from exc
        services[name] = LLMService(name, scheduler)
    return services


def _step(histogram):
    def on_step(rows: int, seconds: float) -> None:
        histogram.observe(rows)

    return on_step


def _finished(metrics, name: str):
    generated, prompt = metrics.generated.labels(name), metrics.prompt_tokens.labels(name)
    speed = metrics.tokens_per_s.labels(name)

    def on_finished(result) -> None:
        generated.inc(result.completion_tokens)
        prompt.inc(result.prompt_tokens)
        metrics.finished.labels(name, result.finish_reason).inc()
        if result.tokens_per_s is not None:
            speed.observe(result.tokens_per_s)

    return on_finished


def add_routes(app: FastAPI, state, services: dict[str, LLMService]) -> None:
    """``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions`` for ``services``; ``state``
    (``app.ServerState``) reads bodies within its limits and counts requests and failures."""

    @app.get("/v1/models")
    async def models() -> Response:
        data = [s.model_card() for s in services.values()]
        return Response(json.dumps({"object": "list", "data": data}), media_type="application/json")

    async def completions(request: Request) -> Response:
        return await _generate(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await _generate(request, chat=True)

    app.add_route("/v1/completions", completions, methods=["POST"], include_in_schema=False)
    app.add_route(
        "/v1/chat/completions", chat_completions, methods=["POST"], include_in_schema=False
    )

    async def _generate(request: Request, *, chat: bool) -> Response:
        m = state.metrics
        label = "_unknown"
        start = time.perf_counter()
        try:
            body = await _body(state, request)
            name = body.get("model")
            service = services.get(name) if isinstance(name, str) else None
            if service is None and len(services) == 1 and name in (None, ""):
                service = next(iter(services.values()))
            if service is None:
                raise OpenAIError(
                    404,
                    f"no model named {name!r} (models: {', '.join(services)})",
                    param="model",
                    code="model_not_found",
                )
            label = service.name
            m.requests.labels(label).inc()
            state.active += 1
            try:
                response = await _answer(service, body, request, chat=chat)
            finally:
                state.active -= 1
        except RequestError as exc:
            m.failures.labels(label, str(exc.status)).inc()
            response = _fail(exc)
        except ClientDisconnect:
            m.failures.labels(label, "499").inc()
            response = Response(status_code=499)
        except asyncio.CancelledError:
            if not state.draining:
                raise
            response = _fail(state.cut(label))  # a stream already under way just ends
        m.latency.labels(label).observe(time.perf_counter() - start)
        return response

    async def _answer(service: LLMService, body: dict, request: Request, *, chat: bool) -> Response:
        scheduler = service.scheduler
        llm = scheduler.llm
        loop = asyncio.get_running_loop()
        try:
            if chat:
                messages = _messages(body)
                ids = await loop.run_in_executor(
                    state.coder, lambda: llm.prompt_ids(messages=messages)
                )
            else:
                ids = _prompt_ids(llm, body)
        except ModelpressError as exc:
            raise _from_library(exc) from None
        if len(ids) >= scheduler.max_context:
            raise OpenAIError(
                400,
                f"the prompt has {len(ids)} tokens, and this model's context is "
                f"{scheduler.max_context} tokens (--max-context): shorten it",
                param="messages" if chat else "prompt",
                code="context_length_exceeded",
            )
        default = scheduler.max_context - len(ids) if chat else COMPLETION_DEFAULT_TOKENS
        params = _params(body, default_tokens=default)
        stream, usage = _flag(body, "stream"), _include_usage(body)
        job = GenerationRequest(prompt_ids=ids, params=params)
        try:
            events = await scheduler.submit(job)
        except ModelpressError as exc:
            raise _from_library(exc) from None
        reply = _Reply(service.name, chat=chat)
        if stream:
            return StreamingResponse(
                reply.stream(events, include_usage=usage),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
            )
        result = await _unless_gone(_last(events), request)
        if result is None:  # the client went away: its sequence has left the batch
            state.metrics.failures.labels(service.name, "499").inc()
            return Response(status_code=499)
        if result.finish_reason == "error":
            ref = logged(f"generation on {service.name!r} failed: {result.error}")
            raise OpenAIError(500, f"generation failed (server log #{ref})")
        return Response(json.dumps(reply.document(result)), media_type="application/json")


async def _last(events):
    result = None
    async for event in events:
        result = event.result or result
    return result


async def _unless_gone(work, request: Request):
    """``work``'s result, or None (``work`` cancelled) when the client disconnects first: once
    the body is read, ``receive`` returns ``http.disconnect`` when the client goes away."""
    task = asyncio.ensure_future(work)
    gone = None
    try:
        while not task.done():
            gone = asyncio.ensure_future(request.receive())
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
            if gone.done() and gone.result().get("type") == "http.disconnect":
                break
    finally:
        if gone is not None:
            gone.cancel()
        if not task.done():
            task.cancel()  # the events' iterator ends: the sequence leaves the batch
            await asyncio.wait({task})
    return None if task.cancelled() else task.result()


def body_limit(options, services: dict) -> int:
    """The largest body a generation request may have: a prompt fills at most the context, and
    64 bytes a token is room for any text as JSON; plus 64 KiB for the other fields."""
    contexts = [s.scheduler.max_context for s in services.values()]
    return min(options.max_body_bytes, 65536 + 64 * max(contexts, default=0))


async def _body(state, request: Request) -> dict:
    options = state.options
    raw = await read_body(
        request,
        body_limit(options, state.llms),
        timeout_s=options.body_timeout_s,
        why="the context (--max-context)",
    )
    return json_object(raw, "the body", error=OpenAIError)


class _Reply:
    """The documents and chunks of one answer, in OpenAI's shapes."""

    def __init__(self, model: str, *, chat: bool):
        self.model = model
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    @staticmethod
    def _finish(result) -> str:
        return "length" if result.finish_reason == "length" else "stop"

    @staticmethod
    def usage(result) -> dict:
        return {
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens,
        }

    def document(self, result) -> dict:
        if self.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": result.text},
                "logprobs": None,
                "finish_reason": self._finish(result),
            }
            kind = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": result.text,
                "logprobs": None,
                "finish_reason": self._finish(result),
            }
            kind = "text_completion"
        return {**self._head(kind), "choices": [choice], "usage": self.usage(result)}

    def chunk(self, text: str | None, finish: str | None, *, first: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {**self._head("text_completion"), "choices": [choice]}

    async def stream(self, events, *, include_usage: bool):
        def sse(doc: dict) -> bytes:
            return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"

        try:
            if self.chat:
                yield sse(self.chunk(None, None, first=True))
            async for event in events:
                if event.text:
                    yield sse(self.chunk(event.text, None))
                result = event.result
                if result is None:
                    continue
                if result.finish_reason == "error":
                    ref = logged(f"generation on {self.model!r} failed: {result.error}")
                    error = OpenAIError(500, f"generation failed (server log #{ref})")
                    yield b"data: " + error.body() + b"\n\n"
                    return
                yield sse(self.chunk(None, self._finish(result)))
                if include_usage:
                    yield sse(
                        {
                            **self._head(self._chunk_kind()),
                            "choices": [],
                            "usage": self.usage(result),
                        }
                    )
            yield b"data: [DONE]\n\n"
        finally:
            await events.aclose()  # a client that went away: the request leaves the batch

    def _chunk_kind(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"
