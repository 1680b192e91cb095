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
from collections.abc import Callable

from openai_api.errors import error_body
from protocol.burst_log import BurstLog

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/responses"})
RETRY_AFTER_SECONDS = 1
logger = logging.getLogger(__name__)
refusals = BurstLog(logger)

OnRefused = Callable[[str, bytes, int, str], None]  # (path, Authorization header, status, code)


class AdmissionLimit:
    """ASGI middleware: POSTs to the generation endpoints beyond `limit` in flight (0: no limit), or beyond
    `capacity()` (the embedded engine's running + queued jobs; None: not known yet) get 503 at once.

    Under `serve` the edge (inference_site/edge.py) keeps the count instead (`at_the_edge`): it refuses as a
    request's last byte is read, writing the answer at once, where the middleware's answer waited for a
    turn of the event loop behind every request already admitted (a second, at 800 streams on 2 cores)."""

    def __init__(self, app, limit: int, capacity: Callable[[], int | None] | None = None,
                 on_refused: OnRefused | None = None) -> None:
        self.app = app
        self.limit = limit
        self.capacity = capacity
        self.on_refused = on_refused
        self.in_flight = 0
        self.at_the_edge = False
        self.stopping = False  # a graceful stop began (inference_site/graceful_stop.py): nothing new is taken

    async def __call__(self, scope, receive, send) -> None:
        if (self.at_the_edge or scope["type"] != "http" or scope.get("method") != "POST"
                or scope.get("path") not in GENERATION_PATHS):
            return await self.app(scope, receive, send)
        refused = self.enter()
        if refused is not None:
            authorization = next((v for name, v in scope.get("headers") or () if name == b"authorization"), b"")
            await answer(send, *refused)
            self.refused(scope["path"], authorization, refused[0])
            return
        try:
            return await self.app(scope, receive, send)
        finally:
            self.leave()

    def enter(self) -> tuple[str, str] | None:
        """Count one more request in, or (code, message) when it is one too many."""
        if self.stopping:
            return "server_shutting_down", "The server is shutting down. Retry shortly (on another server)."
        capacity = self.capacity() if self.capacity is not None else None
        if capacity is not None and self.in_flight >= capacity and (self.limit <= 0 or capacity < self.limit):
            return "queue_full", "The server is at capacity: too many requests are queued. Retry shortly."
        if 0 < self.limit <= self.in_flight:
            return "server_busy", f"The server is at capacity: {self.limit} requests are in progress here. Retry shortly."
        self.in_flight += 1
        return None

    def leave(self) -> None:
        self.in_flight -= 1

    def refused(self, path: str, authorization: bytes, code: str) -> None:
        """Logged once per burst; its ledger row (`on_refused`)."""
        refusals.note(code, "answering 503 %s at the door: %d generation requests in flight", code, self.in_flight)
        if self.on_refused is not None:
            try:
                self.on_refused(path, authorization, 503, code)
            except Exception:  # the answer went out; the log says what was not recorded
                logger.exception("could not record the usage row of a refused request")


async def answer(send, code: str, message: str) -> None:
    body = json.dumps(error_body(503, message, None, code)).encode()
    await send({"type": "http.response.start", "status": 503, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(RETRY_AFTER_SECONDS).encode())]})
    await send({"type": "http.response.body", "body": body})
