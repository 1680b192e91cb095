"""Team limits across two web processes sharing one Redis (and PostgreSQL): N replicas let through what one would."""
from __future__ import annotations

import json
import os
import signal
import time

import httpx
import psycopg
import pytest
import redis

from .conftest import TINY_MODEL
from .live_server import LiveServer, ManagedProcess, base_env
from .services import PostgresServer, RedisServer
from .teams_setup import budget_burst, fresh_minute, make_teams

pytestmark = pytest.mark.scale_out

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def cluster(hf_cache, tmp_path_factory):
    work = tmp_path_factory.mktemp("teams-scale-out")
    redis_server, postgres = RedisServer(work), PostgresServer()
    env = base_env(hf_cache, work, CHANNEL_LAYER_URL=redis_server.url, DATABASE_URL=postgres.url,
                   INFERENCE_WORKER_ACK_TIMEOUT="120", INFERENCE_WORKER_EVENT_TIMEOUT="20",
                   INFERENCE_LEDGER_FLUSH_SECONDS="3")  # /v1/key must not wait for the ledger's batches
    processes = []
    try:
        webs = [LiveServer(env, work, extra_args=("--no-worker",), name=f"web{i}") for i in range(2)]
        processes += webs
        worker = ManagedProcess(["manage.py", "run_worker"], env, work / "worker.log")
        processes.append(worker)
        worker.wait_for_log("listening on channel")
        secrets = make_teams(env, teams={"shared": ["--rpm", "6"], "budget": ["--token-budget", "100"], "doomed": [],
                                         "counted": ["--rpm", "2"]},
                             keys={"shared": ["--team", "shared"], "budget": ["--team", "budget"],
                                   "doomed": ["--team", "doomed"], "counted": ["--team", "counted"]})
        yield webs, secrets, redis_server, postgres, worker
    finally:
        for process in processes:
            process.stop()
        redis_server.stop()
        postgres.stop()


def test_requests_per_minute_hold_across_two_web_processes(cluster):
    webs, secrets, redis_server, postgres, worker = cluster
    warm = httpx.post(f"{webs[0].base_url}/v1/completions", headers=webs[0].headers, timeout=120,
                      json={"model": TINY_MODEL, "prompt": PROMPT, "max_tokens": 2})  # the model loads first
    assert warm.status_code == 200
    fresh_minute(10)
    auth = {"Authorization": f"Bearer {secrets['shared']}"}
    models = [httpx.get(f"{web.base_url}/v1/models", headers=auth) for web in webs]  # read the counters, count nothing
    assert [m.headers["x-ratelimit-remaining-requests"] for m in models] == ["6", "6"]
    statuses, remaining = [], []
    for index in range(12):
        response = httpx.post(f"{webs[index % 2].base_url}/v1/completions", timeout=120, headers=auth,
                              json={"model": TINY_MODEL, "prompt": PROMPT, "max_tokens": 2})
        statuses.append(response.status_code)
        remaining.append(response.headers["x-ratelimit-remaining-requests"])
    assert sorted(statuses) == [200] * 6 + [429] * 6
    assert statuses[:6] == [200] * 6  # both processes counted into one window
    assert remaining == ["5", "4", "3", "2", "1", "0"] + ["0"] * 6  # the 429s too, read back from Redis
    models = [httpx.get(f"{web.base_url}/v1/models", headers=auth) for web in webs]
    assert [(m.status_code, m.headers["x-ratelimit-limit-requests"], m.headers["x-ratelimit-remaining-requests"])
            for m in models] == [(200, "6", "0")] * 2
    keys = redis.Redis.from_url(redis_server.url).keys("inference:limits:*:rpm:*")
    assert keys, "the counters live in Redis"


def test_budget_holds_under_concurrency_across_two_web_processes(cluster):
    webs, secrets, redis_server, postgres, worker = cluster

    served = budget_burst([web.base_url for web in webs], secrets["budget"])
    assert served and sum(served) <= 100 < sum(served) + served[0]
    status = httpx.get(f"{webs[1].base_url}/v1/key", headers={"Authorization": f"Bearer {secrets['budget']}"}).json()
    assert status["data"]["usage"] == sum(served)

    rows = ledger(postgres, "budget", 32)
    assert (len(rows), sum(r[0] + r[1] for r in rows)) == (32, sum(served))


def test_key_status_on_another_web_process_counts_a_response_as_it_ends(cluster):
    """Served on one web process, read on the other at once: the row settled but not yet written is
    noted in Redis, and each request is counted once after the ledger writes it; refusals apart."""
    webs, secrets, redis_server, postgres, worker = cluster
    fresh_minute(20)
    auth = {"Authorization": f"Bearer {secrets['counted']}"}
    body = {"model": TINY_MODEL, "prompt": PROMPT, "max_tokens": 3}
    served = httpx.post(f"{webs[0].base_url}/v1/completions", headers=auth, json=body, timeout=120)
    assert served.status_code == 200
    tokens = served.json()["usage"]["total_tokens"]

    def status() -> tuple[int, int, int]:
        data = httpx.get(f"{webs[1].base_url}/v1/key", headers=auth).json()["data"]
        return data["usage"], data["period_requests"], data["refused_requests"]

    assert status() == (tokens, 1, 0)
    assert ledger(postgres, "counted", 0) == [], "the row was written already: this proves nothing"
    second = httpx.post(f"{webs[1].base_url}/v1/completions", headers=auth, json=body, timeout=120)
    assert second.status_code == 200
    refused = httpx.post(f"{webs[0].base_url}/v1/completions", headers=auth, json=body, timeout=120)
    assert refused.status_code == 429  # the team's 2 requests a minute
    tokens2 = tokens + second.json()["usage"]["total_tokens"]
    assert status() == (tokens2, 2, 1)
    rows = ledger(postgres, "counted", 3)
    assert sorted(row[2] for row in rows) == [200, 200, 429]
    assert status() == (tokens2, 2, 1)  # written now: still counted once
    notes = redis.Redis.from_url(redis_server.url)
    assert not any(notes.hlen(key) for key in notes.keys("inference:ledger:pending:*"))  # written: forgotten


def ledger(postgres: PostgresServer, team: str, count: int) -> list[tuple]:
    """(prompt_tokens, completion_tokens, status_code, error_code, cancelled) of the team's rows, once `count` are in."""
    query = ("select prompt_tokens, completion_tokens, status_code, error_code, cancelled from teams_usagerecord u "
             "join teams_team t on t.id = u.team_id where t.name = %s")
    deadline = time.monotonic() + 30
    while True:
        with psycopg.connect(postgres.url) as db:
            rows = db.execute(query, (team,)).fetchall()
        if len(rows) >= count or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def test_a_worker_dying_mid_stream_is_ledgered_with_what_was_generated(cluster):
    """Last in this module: it kills the only worker."""
    webs, secrets, redis_server, postgres, worker = cluster
    received, error = 0, None
    with httpx.stream("POST", f"{webs[0].base_url}/v1/completions", timeout=120,
                      headers={"Authorization": f"Bearer {secrets['doomed']}"},
                      json={"model": TINY_MODEL, "prompt": PROMPT, "max_tokens": 480, "n": 8, "stream": True,
                            "ignore_eos": True, "return_token_ids": True}) as response:
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                error = chunk["error"]
                continue
            received += sum(len(choice["token_ids"]) for choice in chunk["choices"])
            if worker.process.poll() is None:
                os.killpg(worker.process.pid, signal.SIGKILL)
    assert error is not None and error["code"] == "worker_lost"
    rows = ledger(postgres, "doomed", 1)
    assert len(rows) == 1
    prompt, completion, status, code, cancelled = rows[0]
    assert (status, code, cancelled) == (503, "worker_lost", False)
    assert completion == received and 0 < received < 480 * 8
