"""Web-side admission: a web process takes at most so many generation requests at once.

Workers bound their own queues and answer 503 when full, but that answer costs the whole request
path first (Django, the key lookup, the body, a round trip to the worker): at ten times capacity on
2 cores the refusals queued behind each other for seconds. Here, before Django sees a request, a
generation POST past the limit gets OpenAI's 503 shape with Retry-After at once: past
WEB_MAX_IN_FLIGHT (`server_busy`), or, where the engine runs in this process (`serve`'s embedded
worker, which passes `capacity`), past what the engine can run and queue (`queue_full`, as the
engine itself would answer). Together with a deep listen backlog (`serve`), an overloaded server
answers every client at once instead of resetting connections. Each refusal is logged once per
burst, and `on_refused` (the usage ledger's row for it) is told.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from openai_api.errors import error_body
from protocol.burst_log import BurstLog

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/responses"})
RETRY_AFTER_SECONDS = 1
logger = logging.getLogger(__name__)
refusals = BurstLog(logger)

OnRefused = Callable[[dict, int, str], Awaitable[None]]  # (scope, status, code)


class AdmissionLimit:
    """ASGI middleware: POSTs to the generation endpoints beyond `limit` in flight (0: no limit), or beyond
    `capacity()` (the embedded engine's running + queued jobs; None: not known yet) get 503 at once."""

    def __init__(self, app, limit: int, capacity: Callable[[], int | None] | None = None,
                 on_refused: OnRefused | None = None) -> None:
        self.app = app
        self.limit = limit
        self.capacity = capacity
        self.on_refused = on_refused
        self.in_flight = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in GENERATION_PATHS:
            return await self.app(scope, receive, send)
        refused = self._refusal()
        if refused is not None:
            return await self._refuse(scope, send, *refused)
        self.in_flight += 1
        try:
            return await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1

    def _refusal(self) -> tuple[str, str] | None:
        """(code, message) when one more request is too many, else None."""
        capacity = self.capacity() if self.capacity is not None else None
        if capacity is not None and self.in_flight >= capacity and (self.limit <= 0 or capacity < self.limit):
            return "queue_full", "The server is at capacity: too many requests are queued. Retry shortly."
        if 0 < self.limit <= self.in_flight:
            return "server_busy", f"The server is at capacity: {self.limit} requests are in progress here. Retry shortly."
        return None

    async def _refuse(self, scope: dict, send, code: str, message: str) -> None:
        refusals.note(code, "answering 503 %s at the door: %d generation requests in flight", code, self.in_flight)
        body = json.dumps(error_body(503, message, None, code)).encode()
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(RETRY_AFTER_SECONDS).encode())]})
        await send({"type": "http.response.body", "body": body})
        if self.on_refused is not None:
            await self.on_refused(scope, 503, code)
