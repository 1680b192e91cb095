"""A Redis restart and a PostgreSQL outage under a web process and real `run_worker`s.

Clients get 503 + Retry-After (never a 500 or a reset) while a service is down, in-flight
streams end with an OpenAI-shaped error event, and serving resumes by itself once it is back:
no process exits or is restarted.
"""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from .conftest import TINY_MODEL
from .ledger_checks import TokenStream, postgres_rows, row_of, sqlite_rows, wait_for_rows
from .live_server import LiveServer, base_env
from .services import PostgresServer, RedisServer
from .helpers.processes import worker_processes

pytestmark = pytest.mark.scale_out
REDIS_DOWN_SECONDS = 3.0
RESUME_WITHIN_SECONDS = 10.0


SENT: list[tuple[int, str]] = []  # (status, error code) of every completion that got an answer: one ledger row each


def complete(web: LiveServer, timeout: float = 30) -> httpx.Response:
    response = httpx.post(f"{web.base_url}/v1/completions", headers=web.headers, timeout=timeout,
                          json={"model": TINY_MODEL, "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0})
    SENT.append((response.status_code, response.json()["error"]["code"] if response.status_code != 200 else ""))
    return response


def assert_one_row_per_request(rows: list[dict], sent: list[tuple[int, str]]) -> None:
    """Every completion sent has its row, with the status and error code its client got."""
    assert sorted((row["status_code"], row["error_code"]) for row in rows) == sorted(sent), (rows, sent)
    assert all(row["key_id"] is not None for row in rows)  # attributed, even those refused before the key's lookup


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


def test_redis_restart(hf_cache, tmp_path):
    redis = RedisServer(tmp_path)
    env = base_env(hf_cache, tmp_path, CHANNEL_LAYER_URL=redis.url, INFERENCE_WORKER_ACK_TIMEOUT="5",
                   INFERENCE_HEARTBEAT_SECONDS="1")
    web = LiveServer(env, tmp_path, extra_args=("--no-worker",), name="web")
    workers = worker_processes(env, tmp_path, 2)
    SENT.clear()
    try:
        assert first_success_within(web, 60) >= 0
        stream = TokenStream(web.base_url, web.key, TINY_MODEL)
        stream.start()
        stream.wait_for_tokens(3)

        redis.stop()
        down_at = time.monotonic()
        assert_unavailable(complete(web))
        health = httpx.get(f"{web.base_url}/health", timeout=10)
        assert health.status_code == 503 and "channel layer" in health.json()["reasons"][0]
        assert httpx.get(f"{web.base_url}/health/live", timeout=5).status_code == 200
        stream.join(15)
        assert not stream.is_alive() and stream.done and stream.error == "channel_layer_unavailable"

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
        # The ledger: the outage's refusals and the cut stream as the clients saw them, not as clients leaving.
        rows = wait_for_rows(lambda: sqlite_rows(tmp_path), len(SENT) + 1)
        stream_row = row_of(rows, stream.id)
        assert (stream_row["status_code"], stream_row["error_code"]) == (503, "channel_layer_unavailable")
        assert stream_row["completion_tokens"] == stream.tokens and not stream_row["cancelled"]
        assert_one_row_per_request([row for row in rows if row is not stream_row], SENT)
    finally:
        for worker in workers:
            worker.stop()
        web.stop()
        redis.stop()


def test_database_outage(hf_cache, tmp_path):
    postgres = PostgresServer()
    redis = RedisServer(tmp_path)
    env = base_env(hf_cache, tmp_path, CHANNEL_LAYER_URL=redis.url, DATABASE_URL=postgres.url,
                   INFERENCE_WORKER_ACK_TIMEOUT="5", INFERENCE_HEARTBEAT_SECONDS="1",
                   INFERENCE_LEDGER_REPLAY_SECONDS="1")
    SENT.clear()
    web = LiveServer(env, tmp_path, extra_args=("--no-worker",), name="web")
    workers = worker_processes(env, tmp_path, 1)

    async def burst(count: int) -> list[int]:
        """Concurrent requests, so several of the web's threads hold a database connection."""
        async with httpx.AsyncClient(timeout=30) as http:
            responses = await asyncio.gather(*[
                http.post(f"{web.base_url}/v1/completions", headers=web.headers,
                          json={"model": TINY_MODEL, "prompt": f"Tale {i}", "max_tokens": 2}) for i in range(count)])
        SENT.extend((r.status_code, "" if r.status_code == 200 else r.json()["error"]["code"]) for r in responses)
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
        # The refusals while it was down were spooled, given their key, and written once it was back.
        assert_one_row_per_request(wait_for_rows(lambda: postgres_rows(postgres.url), len(SENT)), SENT)
        assert SENT.count((503, "database_unavailable")) == 3
    finally:
        for worker in workers:
            worker.stop()
        web.stop()
        redis.stop()
        postgres.stop()
