"""Scale-out's web process keeps the same door as `serve` with its worker: past what the workers can run and
queue, a generation request is answered 503 `queue_full` at once by the web process, not after a round trip
through Redis to a worker (a real Redis, a real `run_worker`, `serve --no-worker`)."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from .conftest import TINY_MODEL
from .helpers.catalog import set_fields
from .live_server import LiveServer, ManagedProcess, base_env

pytestmark = pytest.mark.scale_out


def test_the_scale_out_web_answers_queue_full_at_the_door(hf_cache, tmp_path, redis_server):
    env = base_env(hf_cache, tmp_path, CHANNEL_LAYER_URL=redis_server.url, INFERENCE_MAX_NUM_SEQS="1",
                   INFERENCE_MAX_QUEUE="1", INFERENCE_HEARTBEAT_SECONDS="0.5", INFERENCE_WORKER_ACK_TIMEOUT="30")
    set_fields(env, TINY_MODEL, preload=True)
    web = LiveServer(env, tmp_path, extra_args=("--no-worker",), name="web")
    worker = ManagedProcess(["manage.py", "run_worker"], env, tmp_path / "worker.log")
    try:
        worker.wait_for_log("loaded local/tiny-llama@main on", timeout=120)
        time.sleep(2.5)  # a heartbeat with the worker's free slots, and the web's reading of it

        async def one(client: httpx.AsyncClient) -> tuple[int, str, float]:
            started = time.monotonic()
            response = await client.post("/v1/completions", json={
                "model": TINY_MODEL, "prompt": "Once upon a time", "max_tokens": 48, "ignore_eos": True})
            code = response.json()["error"]["code"] if response.status_code != 200 else ""
            return response.status_code, code, time.monotonic() - started

        async def burst() -> list[tuple[int, str, float]]:
            async with httpx.AsyncClient(base_url=web.base_url, headers=web.headers, timeout=120) as client:
                return await asyncio.gather(*(one(client) for _ in range(12)))

        answers = asyncio.run(burst())
        served = [a for a in answers if a[0] == 200]
        refused = [a for a in answers if a[0] != 200]
        assert 1 <= len(served) <= 4, answers  # one running, one queued (and a heartbeat's worth of slack)
        assert refused and all(status == 503 and code == "queue_full" for status, code, _ in refused), answers
        assert "answering 503 queue_full at the door" in web.log()  # the web process said it, not the worker
        assert max(seconds for *_, seconds in refused) < min(seconds for *_, seconds in served), answers
    finally:
        worker.stop()
        web.stop()
