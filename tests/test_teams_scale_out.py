"""Team limits across two web processes sharing one Redis (and PostgreSQL): N replicas let through what one would."""
from __future__ import annotations

import asyncio
import time

import httpx
import openai
import psycopg
import pytest
import redis
from openai import AsyncOpenAI

from .conftest import TINY_MODEL
from .live_server import LiveServer, ManagedProcess, base_env
from .services import PostgresServer, RedisServer
from .teams_setup import fresh_minute, make_teams

pytestmark = pytest.mark.scale_out

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def cluster(hf_cache, tmp_path_factory):
    work = tmp_path_factory.mktemp("teams-scale-out")
    redis_server, postgres = RedisServer(work), PostgresServer()
    env = base_env(hf_cache, work, CHANNEL_LAYER_URL=redis_server.url, DATABASE_URL=postgres.url,
                   INFERENCE_WORKER_ACK_TIMEOUT="120", INFERENCE_LEDGER_FLUSH_SECONDS="0.2")
    processes = []
    try:
        webs = [LiveServer(env, work, extra_args=("--no-worker",), name=f"web{i}") for i in range(2)]
        processes += webs
        worker = ManagedProcess(["manage.py", "run_worker"], env, work / "worker.log")
        processes.append(worker)
        worker.wait_for_log("listening on channel")
        secrets = make_teams(env, teams={"shared": ["--rpm", "6"], "budget": ["--token-budget", "100"]},
                             keys={"shared": ["--team", "shared"], "budget": ["--team", "budget"]})
        yield webs, secrets, redis_server, postgres
    finally:
        for process in processes:
            process.stop()
        redis_server.stop()
        postgres.stop()


def test_requests_per_minute_hold_across_two_web_processes(cluster):
    webs, secrets, redis_server, postgres = cluster
    warm = httpx.post(f"{webs[0].base_url}/v1/completions", headers=webs[0].headers, timeout=120,
                      json={"model": TINY_MODEL, "prompt": PROMPT, "max_tokens": 2})  # the model loads first
    assert warm.status_code == 200
    fresh_minute(30)
    statuses = []
    for index in range(12):
        response = httpx.post(f"{webs[index % 2].base_url}/v1/completions", timeout=120,
                              headers={"Authorization": f"Bearer {secrets['shared']}"},
                              json={"model": TINY_MODEL, "prompt": PROMPT, "max_tokens": 2})
        statuses.append(response.status_code)
    assert sorted(statuses) == [200] * 6 + [429] * 6
    assert statuses[:6] == [200] * 6  # both processes counted into one window
    keys = redis.Redis.from_url(redis_server.url).keys("inference:limits:*:rpm:*")
    assert keys, "the counters live in Redis"


def test_budget_holds_under_concurrency_across_two_web_processes(cluster):
    webs, secrets, redis_server, postgres = cluster

    async def one(client: AsyncOpenAI):
        try:
            result = await client.completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=8,
                                                     extra_body={"ignore_eos": True})
            return result.usage.total_tokens
        except openai.RateLimitError as exc:
            assert exc.body["code"] == "insufficient_quota"
            return None

    async def burst():
        clients = [AsyncOpenAI(base_url=f"{web.base_url}/v1", api_key=secrets["budget"], max_retries=0, timeout=120)
                   for web in webs]
        return await asyncio.gather(*(one(clients[i % 2]) for i in range(32)))

    served = [tokens for tokens in asyncio.run(burst()) if tokens is not None]
    assert served and sum(served) <= 100 < sum(served) + served[0]
    status = httpx.get(f"{webs[1].base_url}/v1/key", headers={"Authorization": f"Bearer {secrets['budget']}"}).json()
    assert status["data"]["usage"] == sum(served)

    def ledger_total():
        with psycopg.connect(postgres.url) as db:
            return db.execute("select count(*), coalesce(sum(prompt_tokens + completion_tokens), 0) "
                              "from teams_usagerecord u join teams_team t on t.id = u.team_id "
                              "where t.name = 'budget'").fetchone()

    deadline = time.monotonic() + 20
    while ledger_total()[0] < 32 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ledger_total() == (32, sum(served))
