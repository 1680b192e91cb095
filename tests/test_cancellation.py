"""A client that goes away mid-stream stops its generation on the worker at once."""
from __future__ import annotations

import re
import time

import httpx

from .conftest import TINY_MODEL


def test_disconnect_mid_stream_cancels_the_job_and_frees_the_worker(server, client):
    # 8 choices of 480 tokens: far more work than the moment it takes the server to notice.
    body = {"model": TINY_MODEL, "prompt": "Once upon a time", "max_tokens": 480, "n": 8, "stream": True,
            "ignore_eos": True, "temperature": 0}
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, headers=server.headers, timeout=60) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        chunk_line = next(line for line in lines if line.startswith("data: {"))
        request_id = re.search(r'"id":"(cmpl-[0-9a-f]+)"', chunk_line).group(1)
    # The connection is closed: the worker must log the cancellation with fewer tokens than asked.
    deadline = time.monotonic() + 30
    while f"cancelled {request_id}" not in server.log():
        assert time.monotonic() < deadline, server.log()[-3000:]
        time.sleep(0.05)
    generated = int(re.search(rf"cancelled {request_id} after (\d+) tokens", server.log()).group(1))
    assert generated < 8 * 480
    result = client.completions.create(model=TINY_MODEL, prompt="next", max_tokens=4)
    assert result.usage.completion_tokens == 4


CANCELLED = re.compile(r"cancelled cmpl-[0-9a-f]+ after (\d+) tokens")


def test_non_streaming_client_that_gives_up_cancels_too(server):
    before = len(CANCELLED.findall(server.log()))
    body = {"model": TINY_MODEL, "prompt": "A long story", "max_tokens": 490, "n": 4, "ignore_eos": True}
    try:
        httpx.post(f"{server.base_url}/v1/completions", json=body, headers=server.headers, timeout=0.3)
    except httpx.ReadTimeout:
        pass
    else:
        raise AssertionError("the request finished before the client gave up; make it longer")
    deadline = time.monotonic() + 30
    while len(CANCELLED.findall(server.log())) == before:
        assert time.monotonic() < deadline, server.log()[-3000:]
        time.sleep(0.05)
    assert int(CANCELLED.findall(server.log())[-1]) < 4 * 490
