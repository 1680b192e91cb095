"""A hostile client's probe: every malformed request gets a 4xx in OpenAI's shape, one log line,
no traceback, and the server serves the next request."""
from __future__ import annotations

import json
import socket

import httpx
import pytest

from .conftest import TINY_MODEL
from .helpers.errors import assert_openai_error

def deep(levels: int, opener: str, closer: str, leaf: str = "1") -> str:
    return opener * levels + leaf + closer * levels


def nested_parameters(levels: int) -> str:
    """A JSON Schema nested `levels` objects deep, as JSON text (json.dumps itself would recurse too deep)."""
    return deep(levels, '{"type": "object", "properties": {"a": ', "}}", '{"type": "string"}')


def tool_request(levels: int) -> str:
    tool = '{"type": "function", "function": {"name": "f", "parameters": %s}}' % nested_parameters(levels)
    return ('{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "tools": [%s]}'
            % (TINY_MODEL, tool))


# (name, path, raw JSON body, expected status, expected param or None)
BAD_JSON_BODIES = [
    ("prompt nested 100k deep", "/v1/completions",
     '{"model": "%s", "prompt": %s}' % (TINY_MODEL, deep(100_000, "[", "]")), 400, None),
    ("stream_options nested 100k deep", "/v1/completions",
     '{"model": "%s", "prompt": "hi", "stream": true, "stream_options": %s}'
     % (TINY_MODEL, deep(100_000, '{"a":', "}")), 400, None),
    ("lone surrogates in a prompt", "/v1/completions",
     '{"model": "%s", "prompt": "\\ud800x\\udfff", "max_tokens": 2}' % TINY_MODEL, 400, "prompt"),
    ("lone surrogates in a streamed prompt", "/v1/completions",
     '{"model": "%s", "prompt": "\\ud800x\\udfff", "max_tokens": 2, "stream": true}' % TINY_MODEL, 400, "prompt"),
    ("lone surrogate in a chat message", "/v1/chat/completions",
     '{"model": "%s", "messages": [{"role": "user", "content": "a\\udc00"}], "max_tokens": 2}' % TINY_MODEL,
     400, "messages[0].content"),
    ("lone surrogate in Responses input", "/v1/responses",
     '{"model": "%s", "input": "\\ud800", "max_output_tokens": 2}' % TINY_MODEL, 400, "input"),
    ("lone surrogate in a key", "/v1/completions",
     '{"model": "%s", "prompt": "hi", "logit_bias": {"\\ud800": 1}}' % TINY_MODEL, 400, None),
    ("a superscript digit as a logit_bias key", "/v1/completions",
     json.dumps({"model": TINY_MODEL, "prompt": "hi", "logit_bias": {"²": 1}}), 400, "logit_bias"),
    ("a superscript digit as a streamed logit_bias key", "/v1/completions",
     json.dumps({"model": TINY_MODEL, "prompt": "hi", "stream": True, "logit_bias": {"²": 1}}), 400, "logit_bias"),
    ("an Arabic-Indic digit as a logit_bias key", "/v1/completions",
     json.dumps({"model": TINY_MODEL, "prompt": "hi", "logit_bias": {"٣": 1}}), 400, "logit_bias"),
    ("tool parameters nested 900 deep", "/v1/chat/completions",
     tool_request(900), 400, None),
    ("min_tokens beyond any context", "/v1/completions",
     json.dumps({"model": TINY_MODEL, "prompt": "hi", "max_tokens": 2, "min_tokens": 10**12}), 400, "min_tokens"),
    ("min_tokens over max_tokens", "/v1/completions",
     json.dumps({"model": TINY_MODEL, "prompt": "hi", "max_tokens": 2, "min_tokens": 3}), 400, "min_tokens"),
    ("top_k 10**9", "/v1/completions",
     json.dumps({"model": TINY_MODEL, "prompt": "hi", "top_k": 10**9}), 400, "top_k"),
    ("no_repeat_ngram_size 10**9", "/v1/completions",
     json.dumps({"model": TINY_MODEL, "prompt": "hi", "no_repeat_ngram_size": 10**9}), 400, "no_repeat_ngram_size"),
    ("a number too large for a float", "/v1/completions",
     '{"model": "%s", "prompt": "hi", "temperature": 1e400}' % TINY_MODEL, 400, None),
    ("NaN", "/v1/completions", '{"model": "%s", "prompt": "hi", "temperature": NaN}' % TINY_MODEL, 400, None),
    ("an integer with 100k digits", "/v1/completions",
     '{"model": "%s", "prompt": "hi", "max_tokens": %s}' % (TINY_MODEL, "9" * 100_000), 400, None),
    ("bytes that are not UTF-8", "/v1/completions", b'{"model": "x", "prompt": "\xff\xfe"}', 400, None),
    ("chat content nested deep", "/v1/chat/completions",
     '{"model": "%s", "messages": [{"role": "user", "content": %s}]}' % (TINY_MODEL, deep(5000, "[", "]")),
     400, None),
    ("tokenize with a surrogate", "/tokenize", '{"model": "%s", "prompt": "\\udfff"}' % TINY_MODEL, 400, "prompt"),
]


@pytest.fixture(scope="module", autouse=True)
def warm(warm_server):
    """The first job starts the worker's engine (torch import, model load): not part of what is probed."""


@pytest.mark.parametrize("name,path,body,status,param", BAD_JSON_BODIES, ids=[b[0] for b in BAD_JSON_BODIES])
def test_malformed_bodies_are_4xx_in_openai_shape(server, name, path, body, status, param):
    raw = body if isinstance(body, bytes) else body.encode("utf-8")
    response = httpx.post(server.base_url + path, content=raw, timeout=60,
                          headers={**server.headers, "Content-Type": "application/json"})
    assert_openai_error(response, status, param=param)


def raw_http(server, request: bytes) -> tuple[int, dict, bytes]:
    """Send bytes as they are (httpx refuses to send most of these); status, headers, body."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data, "the connection closed without a response"
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = dechunk(body)
    return int(lines[0].split()[1]), headers, body


def dechunk(body: bytes) -> bytes:
    out = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        out, body = out + rest[:size], rest[size + 2:]
    return out


def assert_raw_error(result: tuple[int, dict, bytes], status: int) -> dict:
    code, headers, body = result
    assert code == status, body[:500]
    assert headers.get("content-type", "").startswith("application/json")
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def completion_request(server, extra_headers: bytes = b"", path: bytes = b"/v1/completions", body: bytes = b"{}",
                       length: bytes | None = None) -> bytes:
    length = str(len(body)).encode() if length is None else length
    return (b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            b"Authorization: Bearer " + server.key.encode() + b"\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + length + b"\r\n" + extra_headers + b"\r\n" + body)


def test_a_negative_content_length_is_400_with_a_body(server):
    assert_raw_error(raw_http(server, completion_request(server, length=b"-5")), 400)


def test_a_huge_path_is_414(server):
    path = b"/v1/" + b"a" * 50_000
    assert_raw_error(raw_http(server, completion_request(server, path=path)), 414)


def test_a_huge_header_is_431(server):
    request = (b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
               b"Authorization: Bearer " + b"k" * 60_000 + b"\r\n\r\n")
    assert_raw_error(raw_http(server, request), 431)
    many = b"".join(b"X-Filler-%d: %s\r\n" % (i, b"v" * 100) for i in range(400))
    assert_raw_error(raw_http(server, completion_request(server, extra_headers=many)), 431)


def test_a_header_beyond_the_http_parser_limit_is_still_answered(server):
    request = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Huge: " + b"h" * 2_000_000 + b"\r\n\r\n"
    assert_raw_error(raw_http(server, request), 431)


@pytest.mark.parametrize("method,path", [
    ("TRACE", "/v1/models"), ("TRACE", "/health"), ("GET", "/v1/completions"), ("PUT", "/v1/chat/completions"),
    ("DELETE", "/v1/models"), ("GET", "/tokenize"), ("POST", "/v1/models"), ("POST", "/metrics"),
    ("POST", "/openapi.json"), ("POST", "/health"), ("DELETE", "/health/live"),
])
def test_wrong_methods_are_405(server, method, path):
    response = httpx.request(method, server.base_url + path, headers=server.headers, timeout=30)
    assert_openai_error(response, 405)


def test_bad_requests_log_one_line_each_and_no_traceback_and_the_server_keeps_serving(server, client):
    before = len(server.log())
    body = tool_request(900)
    response = httpx.post(f"{server.base_url}/v1/chat/completions", content=body, timeout=60,
                          headers={**server.headers, "Content-Type": "application/json", "X-Request-Id": "probe-1"})
    assert response.status_code == 400
    assert response.headers["x-request-id"] == "probe-1"
    result = client.completions.create(model=TINY_MODEL, prompt="still serving", max_tokens=2)
    assert result.usage.completion_tokens == 2
    log = server.log()[before:]
    assert "Traceback" not in log
    assert len(log) < 2000, log[:3000]
    rejected = [line for line in log.splitlines() if "probe-1" in line]
    assert len(rejected) == 1 and " 400 " in rejected[0], log
