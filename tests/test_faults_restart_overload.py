"""A restarted `serve` serves its first request at once, and an overloaded one answers every client."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx

from .conftest import TINY_MODEL
from .live_server import LiveServer, base_env
from .helpers.catalog import manage


def complete(server: LiveServer) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/completions", headers=server.headers, timeout=60,
                      json={"model": TINY_MODEL, "prompt": "Once upon a time", "max_tokens": 4})


def worker_statuses(env: dict[str, str]) -> list[str]:
    out = manage(env, "shell", "-c", "from catalog.models import Worker; "
                                     "print(sorted(Worker.objects.values_list('status', flat=True)))")
    return json.loads(out.strip().splitlines()[-1].replace("'", '"'))


def test_a_restarted_serve_serves_its_first_request_at_once(hf_cache, tmp_path):
    # An ack timeout the first request would hit if it were routed to the previous process's channel.
    env = base_env(hf_cache, tmp_path, INFERENCE_WORKER_ACK_TIMEOUT="10")
    first = LiveServer(env, tmp_path, name="serve1")
    assert complete(first).status_code == 200
    first.stop()  # SIGTERM: a clean shutdown marks its worker stopped
    assert worker_statuses(env) == ["stopped"]

    second = LiveServer(env, tmp_path, name="serve2")
    assert complete(second).status_code == 200
    os.killpg(second.process.pid, signal.SIGKILL)  # no clean shutdown: its row still says online
    second.process.wait(10)
    assert "online" in worker_statuses(env)

    third = LiveServer(env, tmp_path, name="serve3")
    try:
        started = time.monotonic()
        response = complete(third)
        print(f"first request after a kill -9 and restart: {time.monotonic() - started:.2f}s")
        assert response.status_code == 200, response.text
    finally:
        third.stop()


def test_overload_gets_streams_or_503s_never_resets(hf_cache, tmp_path):
    """4x capacity at once: each client gets its whole stream or an OpenAI-shaped 503 with Retry-After."""
    seqs, queue = 8, 32
    clients = 4 * (seqs + queue)
    env = base_env(hf_cache, tmp_path, INFERENCE_MAX_NUM_SEQS=str(seqs), INFERENCE_MAX_QUEUE=str(queue),
                   INFERENCE_WEB_MAX_IN_FLIGHT=str(2 * (seqs + queue)))
    server = LiveServer(env, tmp_path, name="overload")
    assert complete(server).status_code == 200

    async def one(http: httpx.AsyncClient, index: int) -> str:
        body = {"model": TINY_MODEL, "prompt": f"Story {index}:", "max_tokens": 8, "ignore_eos": True, "stream": True}
        async with http.stream("POST", f"{server.base_url}/v1/completions", headers=server.headers,
                               json=body) as response:
            text = "".join([line async for line in response.aiter_lines()])
            if response.status_code == 503:
                error = json.loads(text)["error"]
                assert set(error) == {"message", "type", "param", "code"} and int(response.headers["Retry-After"]) > 0
                return f"503 {error['code']}"
            assert response.status_code == 200, text
            assert text.endswith("data: [DONE]") and '"error"' not in text, text[-300:]
            return "stream"

    async def everyone() -> list[str]:
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=120, limits=limits) as http:
            return await asyncio.gather(*[one(http, i) for i in range(clients)], return_exceptions=True)

    try:
        outcomes = asyncio.run(everyone())
        failures = [repr(o) for o in outcomes if isinstance(o, BaseException)]
        assert not failures, failures[:3]  # no resets, no broken streams
        kinds = {kind: outcomes.count(kind) for kind in set(outcomes)}
        print(f"{clients} clients at once: {kinds}")
        assert kinds.get("stream", 0) >= seqs
        assert complete(server).status_code == 200  # and it serves on
    finally:
        server.stop()


def test_a_queued_stream_hears_keepalives_until_its_first_token(hf_cache, tmp_path):
    """One slot: a stream queued behind another gets SSE comments while it waits, then its tokens."""
    env = base_env(hf_cache, tmp_path, INFERENCE_MAX_NUM_SEQS="1", INFERENCE_SSE_KEEPALIVE_SECONDS="0.05")
    server = LiveServer(env, tmp_path, name="keepalive")
    body = {"model": TINY_MODEL, "prompt": "Once upon a time", "ignore_eos": True, "stream": True}

    async def stream_lines(max_tokens: int, flowing: asyncio.Event | None = None) -> list[str]:
        lines = []
        async with httpx.AsyncClient(timeout=120) as http:
            async with http.stream("POST", f"{server.base_url}/v1/completions", headers=server.headers,
                                   json={**body, "max_tokens": max_tokens}) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    if line.startswith("data: ") and flowing is not None:
                        flowing.set()
                    if line:
                        lines.append(line)
        return lines

    async def both() -> tuple[list[str], list[str]]:
        flowing = asyncio.Event()
        running = asyncio.ensure_future(stream_lines(480, flowing))  # nearly the tiny model's whole context
        await flowing.wait()  # the first holds the only slot from here until its last token (not a fixed sleep:
        return tuple(await asyncio.gather(running, stream_lines(4)))  # a fast machine ends it sooner)

    try:
        assert complete(server).status_code == 200
        first, queued = asyncio.run(both())
    finally:
        server.stop()
    first_data = next(i for i, line in enumerate(queued) if line.startswith("data: "))
    assert queued[0] == ": accepted"
    assert ": keepalive" in queued[1:first_data]
    assert ": keepalive" not in queued[first_data:]  # once tokens flow, every line is data
    assert queued[-1] == "data: [DONE]" and any('"text"' in line for line in queued)
    assert first[-1] == "data: [DONE]"

