"""The ledger tells the truth (real servers): a web process killed with -9 mid-stream still bills its
streams what they were sent, and requests answered before they were metered (the door full) have their
rows. The faults of the scale-out deployment (Redis, PostgreSQL, a worker killed) are checked the same way
in their own tests (test_faults_services.py, test_faults_worker_death.py)."""
from __future__ import annotations

import asyncio
import os
import signal

import httpx
import pytest

from .conftest import TINY_MODEL
from .ledger_checks import TokenStream, row_of, sqlite_rows, wait_for_rows
from .live_server import LiveServer, base_env
from .test_failpoints_engine import load

pytestmark = pytest.mark.timeout(300)


def test_streams_of_a_web_process_killed_with_9_are_billed_what_they_were_sent(hf_cache, tmp_path):
    env = base_env(hf_cache, tmp_path, INFERENCE_LEDGER_REPLAY_SECONDS="1")
    live = LiveServer(env, tmp_path, name="killed")
    load(live)
    finished = TokenStream(live.base_url, live.key, TINY_MODEL, max_tokens=3)
    finished.start()
    finished.join(60)
    streams = [TokenStream(live.base_url, live.key, TINY_MODEL, max_tokens=480) for _ in range(3)]
    whole = TokenStream(live.base_url, live.key, TINY_MODEL, max_tokens=480, stream=False)
    for stream in (*streams, whole):
        stream.start()
    for stream in streams:
        stream.wait_for_tokens(5)
    os.killpg(live.process.pid, signal.SIGKILL)
    live.process.wait(10)
    for stream in (*streams, whole):
        stream.join(30)
    assert all(stream.error == "cut" for stream in streams) and whole.status == 0
    again = LiveServer(base_env(hf_cache, tmp_path, INFERENCE_LEDGER_REPLAY_SECONDS="1"), tmp_path, name="restarted")
    try:
        rows = wait_for_rows(lambda: sqlite_rows(tmp_path), 5)
        assert len(rows) == 5, rows  # one per request sent, the cut ones included
        assert row_of(rows, finished.id)["completion_tokens"] == 3
        for stream in streams:
            row = row_of(rows, stream.id)
            assert (row["status_code"], row["error_code"]) == (200, "server_lost"), row
            assert row["completion_tokens"] == stream.tokens, (row, stream.tokens)
        lost = [row for row in rows if row["status_code"] == 502]
        assert len(lost) == 1 and lost[0]["error_code"] == "server_lost" and lost[0]["completion_tokens"] == 0
        assert "settled 4 requests a dead process left open" in again.log()
    finally:
        again.stop()


def test_requests_refused_at_the_door_have_their_rows(hf_cache, tmp_path):
    env = base_env(hf_cache, tmp_path, INFERENCE_MAX_NUM_SEQS="1", INFERENCE_MAX_QUEUE="1")
    live = LiveServer(env, tmp_path, name="door")
    try:
        load(live)

        async def burst() -> list[int]:
            async with httpx.AsyncClient(timeout=120) as http:
                responses = await asyncio.gather(*[
                    http.post(f"{live.base_url}/v1/completions", headers=live.headers,
                              json={"model": TINY_MODEL, "prompt": f"Tale {i}", "max_tokens": 64, "ignore_eos": True})
                    for i in range(8)])
            return [r.status_code for r in responses]

        statuses = asyncio.run(burst())
        httpx.post(f"{live.base_url}/v1/completions", headers={"Authorization": "Bearer sk-nobody"}, timeout=30,
                   json={"model": TINY_MODEL, "prompt": "x"})  # not a client: 401, and no row
        refused = statuses.count(503)
        assert refused >= 5, statuses
        rows = wait_for_rows(lambda: sqlite_rows(tmp_path), 8)
        assert len(rows) == 8
        door = [row for row in rows if row["status_code"] == 503]
        assert len(door) == refused and {row["error_code"] for row in door} == {"queue_full"}
        assert all(row["team_id"] is not None and row["key_id"] is not None for row in door)
    finally:
        live.stop()
