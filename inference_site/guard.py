"""ASGI guard in front of every HTTP request: limits, request id, security headers, one access line.

Before Django sees a request: a URL over MAX_URL_BYTES is a 414, headers over MAX_HEADER_BYTES
(or more than MAX_HEADERS of them) a 431, TRACE/CONNECT a 405, a Host outside ALLOWED_HOSTS a
400, each in OpenAI's error shape. Every response carries `X-Request-Id` (the client's, if it
sent a sane one, else a new one), `X-Content-Type-Options: nosniff`, and on HTML pages
`X-Frame-Options: DENY` with `frame-ancestors 'none'`. One log line per request, in the
request's log context; HTTP metrics are counted here (by route, not raw path).
"""
from __future__ import annotations

import functools
import json
import logging
import re
import time

from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.urls import Resolver404, resolve

from openai_api.errors import error_body
from openai_api.metrics import observe_http
from protocol.random_ids import random_hex

from .logs import REQUEST_ID

logger = logging.getLogger("inference_site.access")

MAX_URL_BYTES = 8 * 1024
MAX_HEADER_BYTES = 32 * 1024
MAX_HEADERS = 100
REFUSED_METHODS = {"TRACE", "TRACK", "CONNECT"}
CLIENT_GONE = 499  # logged (as nginx does) when the client left before any response started
SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")  # a decoded path could forge log lines


def request_id_from(headers: list[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        if name == b"x-request-id":
            text = value.decode("latin-1")
            if SANE_REQUEST_ID.fullmatch(text):
                return text
            break
    return random_hex()


def refusal(scope: dict) -> tuple[int, str, str] | None:
    """(status, message, code) for a request the guard answers itself, else None."""
    url_bytes = len(scope.get("raw_path") or scope["path"].encode()) + len(scope.get("query_string") or b"")
    if url_bytes > MAX_URL_BYTES:
        return 414, f"The URL is {url_bytes} bytes long; the limit is {MAX_URL_BYTES}.", "uri_too_long"
    headers = scope.get("headers") or []
    header_bytes = sum(len(name) + len(value) + 4 for name, value in headers)
    if header_bytes > MAX_HEADER_BYTES or len(headers) > MAX_HEADERS:
        return (431, f"The request headers are too large ({len(headers)} headers, {header_bytes} bytes; "
                     f"the limits are {MAX_HEADERS} and {MAX_HEADER_BYTES} bytes).", "headers_too_large")
    if scope["method"] in REFUSED_METHODS:
        return 405, f"Method {scope['method']} is not allowed.", "method_not_allowed"
    host = next((value.decode("latin-1") for name, value in headers if name == b"host"), "")
    domain, _port = split_domain_port(host)
    if host and not (domain and validate_host(domain, settings.ALLOWED_HOSTS)):
        return 400, f"Invalid Host header {host[:100]!r}: add it to DJANGO_ALLOWED_HOSTS.", "invalid_host"
    return None


def route_of(path: str) -> str:
    """The URL pattern a path matches (a bounded set of metric labels), never the raw path.

    Remembered for short paths: Django has resolved the same path once already for the request.
    """
    return _remembered_route_of(path) if len(path) <= 256 else _route_of(path)


def _route_of(path: str) -> str:
    if path.startswith("/" + settings.STATIC_URL.lstrip("/")):
        return "static"
    try:
        match = resolve(path)
    except Resolver404:
        return "unmatched"
    return "/" + str(match.route)


_remembered_route_of = functools.lru_cache(maxsize=2048)(_route_of)


class RequestGuard:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = request_id_from(scope.get("headers") or [])
        token = REQUEST_ID.set(request_id)
        started = time.monotonic()
        outcome = {"status": CLIENT_GONE, "code": None}

        async def send_guarded(message: dict) -> None:
            if message["type"] == "http.response.start":
                outcome["status"] = message["status"]
                message = {**message, "headers": self._headers(message.get("headers") or [], request_id)}
            elif message["type"] == "http.response.body" and outcome["status"] >= 400 and outcome["code"] is None:
                outcome["code"] = error_code(message.get("body") or b"")
            await send(message)

        refused = None
        try:
            refused = refusal(scope)
            if refused is not None:
                await answer(send_guarded, *refused)
            else:
                await self.app(scope, receive, send_guarded)
        finally:
            elapsed = time.monotonic() - started
            self._log(scope, outcome, elapsed)
            refused_early = refused is not None and refused[0] in (414, 431)  # not worth resolving
            observe_http("unmatched" if refused_early else route_of(scope["path"]), scope["method"],
                         outcome["status"], elapsed)
            REQUEST_ID.reset(token)

    @staticmethod
    def _headers(headers: list, request_id: str) -> list:
        present = {name.lower() for name, _ in headers}
        extra = [(b"x-request-id", request_id.encode())]
        if b"x-content-type-options" not in present:
            extra.append((b"x-content-type-options", b"nosniff"))
        content_type = next((value for name, value in headers if name.lower() == b"content-type"), b"")
        if content_type.startswith(b"text/html"):
            if b"x-frame-options" not in present:
                extra.append((b"x-frame-options", b"DENY"))
            if b"content-security-policy" not in present:
                extra.append((b"content-security-policy", b"frame-ancestors 'none'"))
        return [*headers, *extra]

    @staticmethod
    def _log(scope: dict, outcome: dict, elapsed: float) -> None:
        status = outcome["status"]
        path = CONTROL_CHARACTERS.sub("?", scope["path"][:200]) + ("…" if len(scope["path"]) > 200 else "")
        line = f"{scope['method']} {path} {status} {elapsed * 1000:.1f}ms"
        if outcome["code"]:
            line += f" {outcome['code']}"
        logger.log(logging.WARNING if status >= 400 else logging.INFO, line)


async def answer(send, status: int, message: str, code: str) -> None:
    body = json.dumps(error_body(status, message, None, code)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 405:
        headers.append((b"allow", b"GET, POST, HEAD, OPTIONS"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def error_code(body: bytes) -> str | None:
    """The `error.code` of an OpenAI error body, for the access line ("-" when the body is not one)."""
    try:
        return json.loads(body)["error"]["code"] or "-"
    except (ValueError, KeyError, TypeError):
        return "-"
