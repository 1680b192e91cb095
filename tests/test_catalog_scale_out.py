"""Two workers over a real Redis: jobs go where the model is loaded, and a dead worker is noticed."""
from __future__ import annotations

import asyncio
import os
import signal

import pytest
from openai import AsyncOpenAI

from .live_server import LiveServer, ManagedProcess
from .services import RedisServer
from .helpers.catalog import catalog_cache, catalog_env, listed, load_events, manage, wait_until  # noqa: F401

pytestmark = pytest.mark.scale_out


@pytest.fixture
def redis_url(tmp_path):
    server = RedisServer(tmp_path)
    yield server.url
    server.stop()


def burst(web: LiveServer, model: str, count: int) -> list[str]:
    async def run():
        client = AsyncOpenAI(base_url=f"{web.base_url}/v1", api_key=web.key, max_retries=0, timeout=60)
        results = await asyncio.gather(*[client.completions.create(model=model, prompt=f"Tale {i}:", max_tokens=3)
                                         for i in range(count)])
        return [r.choices[0].text for r in results]

    return asyncio.run(run())


def test_jobs_follow_the_loaded_model_and_a_dead_worker_is_lost(catalog_cache, tmp_path, redis_url):  # noqa: F811
    env = catalog_env(catalog_cache, tmp_path, CHANNEL_LAYER_URL=redis_url, INFERENCE_WORKER_LOST_AFTER="3",
                      INFERENCE_WORKER_ACK_TIMEOUT="10")
    manage(env, "migrate", "--verbosity", "0")
    workers = [ManagedProcess(["manage.py", "run_worker"], env, tmp_path / f"worker{i}.log") for i in range(2)]
    web = LiveServer(env, tmp_path, extra_args=("--no-worker",), name="web")
    try:
        for worker in workers:
            worker.wait_for_log("listening on channel")
        assert load_events(web, "local/other")[-1]["status"] == "ready"
        holder = next(w for w in workers if "loaded local/other@main on" in w.log())
        other = next(w for w in workers if w is not holder)
        wait_until(lambda: listed(web)["local/other"]["loaded_on"], what="the catalog to show the holder")
        # Let both workers' routing tables catch up (they refresh every heartbeat).
        import time

        time.sleep(1.5)
        assert len(burst(web, "local/other", 10)) == 10
        assert "local/other" not in other.log()  # every job went to the worker holding the model
        # (the worker logs a job after sending its last event, so the line may trail the response)
        wait_until(lambda: holder.log().count("finished cmpl-") == 10, timeout=5, what="10 jobs on the holder")

        # The commands reach the workers over Redis too.
        out = manage(env, "preload", "local/third")
        assert "'stage': 'weights'" in out and "local/third@main loaded" in out
        out = manage(env, "unload", "local/third", "--wait", "2")
        assert "'status': 'unloaded'" in out and "local/third@main unloaded from 1 worker(s)" in out

        os.killpg(holder.process.pid, signal.SIGKILL)
        wait_until(lambda: listed(web)["local/other"]["status"] == "cached", timeout=20,
                   what="the dead worker's model to count as not loaded")
        time.sleep(1.0)
        assert len(burst(web, "local/other", 2)) == 2  # the survivor loads it itself
        assert "loaded local/other@main on" in other.log()
    finally:
        for worker in workers:
            worker.stop()
        web.stop()
