"""Daphne's HTTP parser (Twisted) answers what it refuses in OpenAI's shape instead of hanging up.

Twisted closes the connection without a word on a request line or header over 16 KiB, and
answers a malformed request (`Content-Length: -5`) with an empty 400. Here its limits are raised
so that sizes up to PARSER_LIMIT reach the ASGI guard (inference_site.guard: 414/431 with a
body), and anything beyond, or malformed, gets a JSON error before the connection closes.
Twisted's own parsing of form bodies is off: Django parses every body itself. The clocks and caps on
connections (a 408 for late headers or a slow body, a 413 before an oversize body) are the edge's
(inference_site/edge.py), which answers through `refuse` here.
"""
from __future__ import annotations

import json

from daphne.http_protocol import WebRequest

PARSER_LIMIT = 1024 * 1024  # bytes of request line + headers Twisted reads before refusing
REFUSED_TIMEOUT = 10  # seconds a refused connection may keep sending before it is dropped
REASONS = {400: "Bad Request", 408: "Request Timeout", 413: "Content Too Large", 414: "URI Too Long",
           431: "Request Header Fields Too Large", 503: "Service Unavailable"}


def error_bytes(status: int, message: str, code: str, headers: dict[str, str] | None = None) -> bytes:
    from openai_api.errors import error_body

    body = json.dumps(error_body(status, message, None, code)).encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    return (f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n").encode() + body


def refuse(channel, status: int, message: str, code: str, headers: dict[str, str] | None = None) -> None:
    """Answer, stop reading (what the client still sends is dropped), close once it is done or quiet.

    The answer is written to the socket at once, not at the loop's next turn for writes: under load that
    turn comes after a step of every request under way (a refusal is worth most then). Closing at once
    while the client is still sending would reset the connection and lose the answer.
    """
    channel.dataReceived = lambda data: None
    channel._buffer = b""  # LineReceiver stops at once instead of parsing the lines it already holds
    channel.transport.write(error_bytes(status, message, code, headers))
    write_now = getattr(channel.transport, "doWrite", None)  # a TCP transport's (not disconnecting yet: no result)
    if write_now is not None:
        write_now()
    channel.transport.loseWriteConnection()
    channel.setTimeout(REFUSED_TIMEOUT)


def line_too_long(channel, line: bytes) -> None:
    if getattr(channel, "_HTTPChannel__first_line", 0):
        refuse(channel, 414, f"The request line is longer than {PARSER_LIMIT} bytes.", "uri_too_long")
    else:
        refuse(channel, 431, f"A request header is longer than {PARSER_LIMIT} bytes.", "headers_too_large")


def bad_request(channel) -> None:
    if channel._receivedHeaderSize > channel.totalHeadersSize:
        refuse(channel, 431, f"The request headers exceed {PARSER_LIMIT} bytes.", "headers_too_large")
    else:
        refuse(channel, 400, "The HTTP request is malformed (request line or headers).", "malformed_request")


class UnparsedBodyWebRequest(WebRequest):
    """Daphne's request without Twisted parsing a POST's form body into `args`, which nothing reads.

    Twisted parsed every POST's Content-Type with the `email` package (about 0.3 ms of the event loop
    per request, a tenth of a completion's web-side time), and a multipart body (an audio upload,
    a batch file) in full, on the event loop, before Django parsed it again.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._parsePOSTFormSubmission = False
