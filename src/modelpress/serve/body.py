"""A request's body, read under the server's limits: its size (413 as soon as it is known to be too
large), the bytes the server holds for every request at once (503), and the time it may take to
arrive (408). The plain routes and the OpenAI routes read bodies the same way."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from fastapi import Request
from starlette.requests import ClientDisconnect

from modelpress.serve.errors import Overloaded, RequestError

if TYPE_CHECKING:
    from modelpress.serve.app import ServerState

CLOSE = {"connection": "close"}


def is_count(text: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also takes '²' (a Latin-1 header byte), which int()
    refuses."""
    return text.isascii() and text.isdigit()


class Held:
    """The request bytes one request holds against the server's ``max_pending_bytes``."""

    def __init__(self, state: ServerState):
        self.state = state
        self.bytes = 0

    def take(self, n: int) -> None:
        state = self.state
        limit = state.options.pending_bytes
        if state.held_bytes + n > limit:
            exc = Overloaded(
                f"the server holds {state.held_bytes} bytes of requests, near its limit of "
                f"{limit} (--max-pending-mb): retry later",
                retry_after_s=state.options.retry_after_s,
            )
            exc.headers = CLOSE  # the rest of this body is not worth reading
            raise exc
        state.held_bytes += n
        self.bytes += n

    def release(self) -> None:
        if self.bytes:
            self.state.held_bytes -= self.bytes
            self.bytes = 0


async def read_body(
    request: Request,
    limit: int,
    *,
    held: Held | None = None,
    timeout_s: float | None = None,
    why: str = "--max-body-mb",
) -> bytes:
    """The body of ``request``, as ``receive_body`` reads it."""
    return await receive_body(
        request.receive,
        request.headers.get("content-length"),
        limit,
        held=held,
        timeout_s=timeout_s,
        why=why,
    )


async def receive_body(
    receive,
    declared: str | None,
    limit: int,
    *,
    held: Held | None = None,
    timeout_s: float | None = None,
    why: str = "--max-body-mb",
) -> bytes:
    """A request's body from the ASGI ``receive`` (``declared``: its Content-Length header),
    refused with 413 as soon as it is known to pass ``limit`` bytes, with 503 when the server
    holds too many request bytes (taken chunk by chunk, so a slow sender holds only what it sent),
    and with 408 when it has not all arrived within ``timeout_s``. ``ClientDisconnect`` when the
    client goes away first."""
    if declared is not None:
        if not is_count(declared):
            raise RequestError(400, "Content-Length is not a number")
        if int(declared) > limit:  # refused unread: close rather than read it to the end
            raise RequestError(
                413,
                f"the body has {declared} bytes, more than the {limit} allowed ({why})",
                headers=CLOSE,
            )
    chunks, size = [], 0

    async def read() -> None:
        nonlocal size
        while True:
            message = await receive()
            if message["type"] != "http.request":  # http.disconnect
                raise ClientDisconnect()
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise RequestError(
                        413, f"the body is larger than the {limit} bytes allowed ({why})"
                    )
                if held is not None:
                    held.take(len(chunk))
                chunks.append(chunk)
            if not message.get("more_body", False):
                return

    if timeout_s is None:
        await read()
    else:
        try:
            if hasattr(asyncio, "timeout"):  # Python 3.11: a timer, no task per request
                async with asyncio.timeout(timeout_s):
                    await read()
            else:  # pragma: no cover - Python 3.10
                await asyncio.wait_for(read(), timeout_s)
        except TimeoutError:
            raise RequestError(
                408,
                f"the body did not arrive within {timeout_s:g} s ({size} bytes came)",
                headers=CLOSE,
            ) from None
    if len(chunks) == 1:
        return chunks[0]
    return b"".join(chunks)
