"""The infer route, ``POST /v2/models/{name}[/versions/{v}]/infer``, straight on ASGI.

It is the server's hot path: a small model answers thousands of these a second, and then the event
loop's own cost per request, not the model, sets the throughput. So the app (``app._App``) hands
an infer request to ``InferRoute`` before FastAPI's middleware stack and router, and the route
reads the body from ``receive`` and answers with two ``send`` calls, with no ``Request`` or
``Response`` objects. Measured with py-spy on zoo ``resnet-digits`` at concurrency 64: the stack
and the router were a fifth of the loop's time per request (benchmarks/results/serve_triton.md).

What a request gets is what it got through FastAPI: the same key check (401 before the body is
read), the same limits and errors (``{"error": message}``, counted per model), and the same 503
for a request cut at shutdown. Anything else on these paths (another method, a trailing slash)
goes through FastAPI as before.
"""

from __future__ import annotations

import asyncio
import json
import time
import traceback

from starlette.requests import ClientDisconnect

from modelpress.serve import auth, raw
from modelpress.serve.batcher import Batcher
from modelpress.serve.body import Held, is_count, receive_body
from modelpress.serve.connections import body_arrived
from modelpress.serve.errors import Overloaded, RequestError, logged, model_failure
from modelpress.serve.options import ServeOptions
from modelpress.serve.protocol import decode_request, decompress, encode_response, error_body
from modelpress.serve.repository import ServedModel

INLINE_BYTES = 256 * 1024  # bodies and answers up to this are decoded and encoded on the loop

# (status, headers as ASGI (name, value) byte pairs without content-length, body)
Answer = tuple[int, list[tuple[bytes, bytes]], bytes]
_JSON = (b"content-type", b"application/json")


def infer_target(path: str) -> tuple[str, str | None] | None:
    """``(name, version)`` for an infer path, as the routes ``/v2/models/{name}/infer`` and
    ``/v2/models/{name}/versions/{version}/infer`` match it (non-empty segments); else None."""
    if not path.startswith("/v2/models/") or not path.endswith("/infer"):
        return None
    parts = path[11:-6].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
        return parts[0], parts[2]
    return None


def json_answer(data, status: int = 200) -> Answer:
    return status, [_JSON], json.dumps(data).encode()


def error_answer(exc: RequestError) -> Answer:
    headers = [_JSON]
    for name, value in (exc.headers or {}).items():
        headers.append((name.lower().encode("latin-1"), str(value).encode("latin-1")))
    if isinstance(exc, Overloaded):
        headers.append((b"retry-after", str(exc.retry_after_s).encode()))
    if exc.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    return exc.status, headers, error_body(exc.message)


async def send_answer(send, answer: Answer) -> None:
    status, headers, body = answer
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def key_refusal(key: str | None, headers) -> RequestError | None:
    """The 401 of a request without the server's ``key`` (``headers``: ASGI byte pairs)."""
    if not key:
        return None
    header = next((v for k, v in headers if k == b"authorization"), None)
    if auth.authorized(header.decode("latin-1") if header is not None else None, key):
        return None
    return RequestError(401, "this server needs 'Authorization: Bearer <key>'")


class InferRoute:
    """Answers infer requests for the app's ``ServerState``."""

    def __init__(self, state):
        self.state = state

    async def __call__(self, scope, receive, send, name: str, version: str | None) -> None:
        refusal = key_refusal(self.state.options.api_key, scope["headers"])
        if refusal is not None:
            self.state.refused(401)
            answer = error_answer(refusal)
        else:
            answer = await self.answer(scope, receive, name, version)
        await send_answer(send, answer)

    async def answer(self, scope, receive, name: str, version: str | None) -> Answer:
        """The answer to one infer request on model ``name`` (its errors included, counted)."""
        state = self.state
        start = time.perf_counter()
        model = state.repository.models.get(name)
        m = state.metrics.model(name if model is not None else "_unknown")  # bounded labels
        m.requests.inc()
        state.active += 1
        state.infer_active += 1
        held = Held(state)
        try:
            model = state.repository.get(name, version)
            answer = await _infer(state, model, scope, receive, held)
        except RequestError as exc:
            m.failure(exc.status).inc()
            answer = error_answer(exc)
        except ClientDisconnect:  # nobody to answer; counted as nginx does
            m.failure(499).inc()
            answer = (499, [], b"")
        except asyncio.CancelledError:
            if not state.draining:
                raise
            answer = error_answer(state.cut(m.label))
        except Exception:
            ref = logged(f"infer on {name!r} raised:\n{traceback.format_exc()}")
            m.failure(500).inc()
            answer = error_answer(RequestError(500, f"internal error (server log #{ref})"))
        finally:
            held.release()
            state.active -= 1
            state.infer_active -= 1
        m.latency.observe(time.perf_counter() - start)
        return answer


def _headers(scope) -> dict[bytes, bytes]:
    """The request's headers by (lower-case) name; the first of repeated ones, as Starlette's."""
    out: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        if name not in out:
            out[name] = value
    return out


def _text(value: bytes | None) -> str | None:
    return value.decode("latin-1") if value is not None else None


async def _infer(state, model: ServedModel, scope, receive, held: Held) -> Answer:
    """Read, decode and check one infer request, run it through the model's batcher, answer."""
    options, batcher = state.options, state.batchers[model.name]
    headers = _headers(scope)
    loop = asyncio.get_running_loop()
    token = id(held)
    state.receiving[token] = time.perf_counter()  # until decoded: the batcher may wait for it
    try:
        limit, why = options.max_body_bytes, "--max-body-mb"
        largest = model.max_body_bytes(options.request_rows) if model.processing is None else None
        if largest is not None and largest < limit:
            # what a valid request of --max-request-rows rows can be, as JSON or binary
            limit, why = largest, f"{options.request_rows} rows (--max-request-rows)"
        body = await receive_body(
            receive,
            _text(headers.get(b"content-length")),
            limit,
            held=held,
            # a body that came with its headers needs no deadline (and the loop no timer)
            timeout_s=None if body_arrived(scope) else options.body_timeout_s,
            why=why,
        )
        encoding = _text(headers.get(b"content-encoding"))
        if encoding and encoding != "identity":
            body = decompress(body, encoding, limit=limit)
            held.take(len(body))
        header_length = _text(headers.get(b"inference-header-content-length"))
        content_type = _text(headers.get(b"content-type"))
        if raw.is_raw(content_type, header_length):
            items = raw.items_from_body(model, body, content_type)
            req = None
        else:
            if header_length is not None and not is_count(header_length):
                raise RequestError(400, "Inference-Header-Content-Length is not a number")
            length = int(header_length) if header_length else None
            if len(body) > INLINE_BYTES:
                req = await loop.run_in_executor(
                    state.coder, lambda: decode_request(body, header_length=length)
                )
            else:
                req = decode_request(body, header_length=length)
    finally:
        del state.receiving[token]
    if req is None:
        answers = await raw.infer(model, batcher, items)
        return json_answer(answers[0] if len(answers) == 1 else answers)
    if raw.is_raw_request(model, req):
        (items,) = req.inputs.values()
        _check_rows(items.size, options)
        outputs = await raw.infer_tensor(model, batcher, req)
    else:
        feeds, rows, key = model.check(req.inputs)
        _check_rows(rows, options)
        wanted = model.output_names(o.name for o in req.outputs) if req.outputs else None
        outputs = await _submit(model, batcher, feeds, rows, key)
        if wanted:
            outputs = {k: outputs[k] for k in wanted}

    def encode():
        return encode_response(
            outputs, model_name=model.name, model_version=model.version, request=req
        )

    if sum(a.nbytes for a in outputs.values()) > INLINE_BYTES:
        payload, response_headers = await loop.run_in_executor(state.coder, encode)
    else:
        payload, response_headers = encode()
    return 200, [(k.encode(), v.encode()) for k, v in response_headers.items()], payload


async def _submit(model: ServedModel, batcher: Batcher, feeds, rows: int, key):
    try:
        return await batcher.submit(feeds, rows, key)
    except Exception as exc:
        raise model_failure(model.name, exc, inputs_of=model.inputs_of) from None


def _check_rows(rows: int, options: ServeOptions) -> None:
    if rows > options.request_rows:
        raise RequestError(
            413,
            f"the request has {rows} rows, more than the {options.request_rows} one request may "
            "bring (--max-request-rows): split it",
        )
