"""The job a team's request puts on the wire: its team (name, share) and, for a batch key, batch priority.

A real web process (`serve --no-worker`, Redis channel layer) takes real HTTP requests; this test
is the worker: it reads the shared worker channel from the same Redis, as `run_worker` does, and
answers each job with an error so the request ends. (The engine's own reading of these fields,
and per-team metrics, belong to the fair-share scheduler.)
"""
from __future__ import annotations

import asyncio

import httpx
import pytest
from channels_redis.core import RedisChannelLayer

from .conftest import TINY_MODEL
from .live_server import LiveServer, base_env
from .services import RedisServer
from .teams_setup import make_teams

pytestmark = pytest.mark.scale_out


@pytest.fixture(scope="module")
def web(hf_cache, tmp_path_factory):
    work = tmp_path_factory.mktemp("team-jobs")
    redis_server = RedisServer(work)
    env = base_env(hf_cache, work, CHANNEL_LAYER_URL=redis_server.url, INFERENCE_WORKER_ACK_TIMEOUT="30")
    server = None
    try:
        server = LiveServer(env, work, extra_args=("--no-worker",))
        server.secrets = make_teams(env, teams={"evals": ["--share", "2.5"], "chat": []},
                                    keys={"evals-batch": ["--team", "evals", "--service-tier", "batch"],
                                          "chat": ["--team", "chat"]})
        yield server, redis_server
    finally:
        if server is not None:
            server.stop()
        redis_server.stop()


async def submit_and_take(base_url: str, secret: str, redis_url: str, body: dict,
                          path: str = "/v1/completions") -> tuple[dict, httpx.Response]:
    layer = RedisChannelLayer(hosts=[redis_url])

    async def worker() -> dict:
        job = await asyncio.wait_for(layer.receive("inference"), 30)
        await layer.send(job["reply_channel"], {"type": "generation.error", "status": 503, "message": "test worker",
                                                "param": None, "code": "test_worker", "retry_after": None})
        return job

    async with httpx.AsyncClient(timeout=60) as http:
        taking = asyncio.create_task(worker())
        response = await http.post(f"{base_url}{path}", json=body,
                                   headers={"Authorization": f"Bearer {secret}"})
        job = await taking
    await layer.flush()
    return job, response


def test_the_job_names_its_team_and_share_and_a_batch_key_runs_at_batch_priority(web):
    server, redis_server = web
    body = {"model": TINY_MODEL, "prompt": "Once upon a time", "max_tokens": 3}

    job, response = asyncio.run(submit_and_take(server.base_url, server.secrets["evals-batch"], redis_server.url, body))
    assert response.status_code == 503 and response.json()["error"]["code"] == "test_worker"  # our answer came back
    assert job["team"] == {"name": "evals", "share": 2.5}
    assert job["params"]["priority_class"] == "batch"  # the key's tier, though the request asked nothing

    job, _ = asyncio.run(submit_and_take(server.base_url, server.secrets["chat"], redis_server.url, body))
    assert job["team"] == {"name": "chat", "share": 1.0}
    assert job["params"]["priority_class"] == "interactive"

    chat = {"model": TINY_MODEL, "messages": [{"role": "user", "content": "hi"}], "service_tier": "flex"}
    job, _ = asyncio.run(submit_and_take(server.base_url, server.secrets["chat"], redis_server.url, chat,
                                         "/v1/chat/completions"))
    assert job["params"]["priority_class"] == "batch"  # a request may ask for batch itself; an interactive key keeps it
