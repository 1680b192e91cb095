"""Web-side admission: a web process takes at most so many generation requests at once.

Workers bound their own queues and answer 503 when full, but every request the web process
holds costs it a connection, a coroutine and channel-layer traffic. Past the limit a request
gets OpenAI's 503 shape with Retry-After before Django sees it; together with a deep listen
backlog (`serve`), an overloaded server answers every client instead of resetting connections.
"""
from __future__ import annotations

import json

from openai_api.errors import error_body

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/responses"})
RETRY_AFTER_SECONDS = 1


class AdmissionLimit:
    """ASGI middleware: POSTs to the generation endpoints beyond `limit` in flight get 503 (0: no limit)."""

    def __init__(self, app, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.in_flight = 0

    async def __call__(self, scope, receive, send) -> None:
        if (self.limit <= 0 or scope["type"] != "http" or scope.get("method") != "POST"
                or scope.get("path") not in GENERATION_PATHS):
            return await self.app(scope, receive, send)
        if self.in_flight >= self.limit:
            return await self._refuse(send)
        self.in_flight += 1
        try:
            return await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _refuse(self, send) -> None:
        body = json.dumps(error_body(
            503, f"The server is at capacity: {self.limit} requests are in progress here. Retry shortly.",
            None, "server_busy")).encode()
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(RETRY_AFTER_SECONDS).encode())]})
        await send({"type": "http.response.body", "body": body})
