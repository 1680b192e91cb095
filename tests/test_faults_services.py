"""A Redis restart and a PostgreSQL outage under a web process and real `run_worker`s.

Clients get 503 + Retry-After (never a 500 or a reset) while a service is down, in-flight
streams end with an OpenAI-shaped error event, and serving resumes by itself once it is back:
no process exits or is restarted.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from .conftest import TINY_MODEL
from .live_server import LiveServer, base_env
from .services import PostgresServer, RedisServer
from .test_faults_supervised import worker_processes

pytestmark = pytest.mark.scale_out
REDIS_DOWN_SECONDS = 3.0
RESUME_WITHIN_SECONDS = 10.0


def complete(web: LiveServer, timeout: float = 30) -> httpx.Response:
    return httpx.post(f"{web.base_url}/v1/completions", headers=web.headers, timeout=timeout,
                      json={"model": TINY_MODEL, "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0})


def assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert int(response.headers["Retry-After"]) > 0
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def first_success_within(web: LiveServer, seconds: float) -> float:
    """Seconds until a completion succeeds (polling), or fail after `seconds`."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        try:
            if complete(web, timeout=seconds).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"no completion succeeded within {seconds}s")


class StreamReader(threading.Thread):
    """One long streamed completion, its SSE events kept as they arrive."""

    def __init__(self, web: LiveServer) -> None:
        super().__init__(daemon=True)
        self.web = web
        self.events: list[str] = []
        self.failure: Exception | None = None

    def run(self) -> None:
        body = {"model": TINY_MODEL, "prompt": "Once", "max_tokens": 400, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", f"{self.web.base_url}/v1/completions", headers=self.web.headers, json=body,
                              timeout=60) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line[len("data: "):])
        except Exception as exc:  # a reset or a hang is exactly what must not happen
            self.failure = exc


def test_redis_restart(hf_cache, tmp_path):
    redis = RedisServer(tmp_path)
    env = base_env(hf_cache, tmp_path, CHANNEL_LAYER_URL=redis.url, INFERENCE_WORKER_ACK_TIMEOUT="5",
                   INFERENCE_HEARTBEAT_SECONDS="1")
    web = LiveServer(env, tmp_path, extra_args=("--no-worker",), name="web")
    workers = worker_processes(env, tmp_path, 2)
    try:
        assert first_success_within(web, 60) >= 0
        stream = StreamReader(web)
        stream.start()
        deadline = time.monotonic() + 30
        while len(stream.events) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(stream.events) >= 3, "the stream should be under way"

        redis.stop()
        down_at = time.monotonic()
        assert_unavailable(complete(web))
        health = httpx.get(f"{web.base_url}/health", timeout=10)
        assert health.status_code == 503 and "channel layer" in health.json()["reasons"][0]
        assert httpx.get(f"{web.base_url}/health/live", timeout=5).status_code == 200
        stream.join(15)
        assert not stream.is_alive() and stream.failure is None
        error = json.loads(stream.events[-2])["error"]
        assert stream.events[-1] == "[DONE]" and error["code"] == "channel_layer_unavailable"

        time.sleep(max(0.0, REDIS_DOWN_SECONDS - (time.monotonic() - down_at)))
        redis.start()
        resumed = first_success_within(web, RESUME_WITHIN_SECONDS)
        print(f"serving resumed {resumed:.2f}s after Redis came back")
        # /health pings the group, which each worker joins again once its own channel reads again.
        deadline = time.monotonic() + RESUME_WITHIN_SECONDS
        while httpx.get(f"{web.base_url}/health", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "/health still 503 10 s after Redis came back"
            time.sleep(0.2)
        assert all(worker.process.poll() is None for worker in workers), "no worker may exit for a Redis restart"
        assert web.process.poll() is None
        # Both workers are back in the group: a cancel or an unload reaches each.
        unload = httpx.post(f"{web.base_url}/unload_model", headers=web.headers, json={"model": TINY_MODEL}, timeout=30)
        assert unload.status_code == 200, unload.text
    finally:
        for worker in workers:
            worker.stop()
        web.stop()
        redis.stop()


def test_database_outage(hf_cache, tmp_path):
    postgres = PostgresServer()
    redis = RedisServer(tmp_path)
    env = base_env(hf_cache, tmp_path, CHANNEL_LAYER_URL=redis.url, DATABASE_URL=postgres.url,
                   INFERENCE_WORKER_ACK_TIMEOUT="5", INFERENCE_HEARTBEAT_SECONDS="1")
    web = LiveServer(env, tmp_path, extra_args=("--no-worker",), name="web")
    workers = worker_processes(env, tmp_path, 1)

    async def burst(count: int) -> list[int]:
        """Concurrent requests, so several of the web's threads hold a database connection."""
        async with httpx.AsyncClient(timeout=30) as http:
            responses = await asyncio.gather(*[
                http.post(f"{web.base_url}/v1/completions", headers=web.headers,
                          json={"model": TINY_MODEL, "prompt": f"Tale {i}", "max_tokens": 2}) for i in range(count)])
        return [r.status_code for r in responses]

    try:
        assert first_success_within(web, 60) >= 0
        assert asyncio.run(burst(8)) == [200] * 8

        postgres.stop_server()
        for _ in range(3):
            assert_unavailable(complete(web))
        health = httpx.get(f"{web.base_url}/health", timeout=10)
        assert health.status_code == 503 and any("database" in r for r in health.json()["reasons"])
        time.sleep(2)

        postgres.start_server()
        assert complete(web).status_code == 200  # the very first request after it is back
        assert asyncio.run(burst(8)) == [200] * 8
        health = httpx.get(f"{web.base_url}/health", timeout=10)
        assert health.status_code == 200, health.text
        assert "Internal Server Error" not in web.log() and "unhandled error" not in web.log()
        assert all(worker.process.poll() is None for worker in workers)
    finally:
        for worker in workers:
            worker.stop()
        web.stop()
        redis.stop()
        postgres.stop()
