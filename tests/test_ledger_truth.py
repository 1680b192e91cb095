"""The ledger tells the truth (real servers): a web process killed with -9 mid-stream still bills its
streams what they were sent, and requests answered before they were metered (the door full) have their
rows. The faults of the scale-out deployment (Redis, PostgreSQL, a worker killed) are checked the same way
in their own tests (test_faults_services.py, test_faults_worker_death.py)."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from .conftest import TINY_MODEL
from .ledger_checks import TokenStream, row_of, sqlite_rows, wait_for_rows
from .live_server import LiveServer, base_env
from .helpers.ledger import load

pytestmark = pytest.mark.timeout(300)


def test_streams_of_a_web_process_killed_with_9_are_billed_what_they_were_sent(hf_cache, tmp_path):
    """Three streams under way, one queued (its 200 sent, no token yet) and a whole answer not sent yet."""
    env = base_env(hf_cache, tmp_path, INFERENCE_LEDGER_REPLAY_SECONDS="1", INFERENCE_MAX_NUM_SEQS="3")
    live = LiveServer(env, tmp_path, name="killed")
    load(live)
    finished = TokenStream(live.base_url, live.key, TINY_MODEL, max_tokens=3)
    finished.start()
    finished.join(60)
    streams = [TokenStream(live.base_url, live.key, TINY_MODEL, max_tokens=480) for _ in range(3)]
    for stream in streams:
        stream.start()
    for stream in streams:
        stream.wait_for_tokens(5)
    queued = TokenStream(live.base_url, live.key, TINY_MODEL, max_tokens=480)
    whole = TokenStream(live.base_url, live.key, TINY_MODEL, max_tokens=480, stream=False)
    for request in (queued, whole):
        request.start()
    deadline = time.monotonic() + 30
    while (queued.status != 200 or "submitted for" not in live.log()[-2000:]) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the whole answer's job has started too
    os.killpg(live.process.pid, signal.SIGKILL)
    live.process.wait(10)
    for request in (*streams, queued, whole):
        request.join(30)
    assert all(stream.error == "cut" for stream in (*streams, queued)) and queued.tokens == 0 and whole.status == 0
    again = LiveServer(base_env(hf_cache, tmp_path, INFERENCE_LEDGER_REPLAY_SECONDS="1"), tmp_path, name="restarted")
    try:
        rows = wait_for_rows(lambda: sqlite_rows(tmp_path), 6)
        assert len(rows) == 6, rows  # one per request sent, the cut ones included
        assert row_of(rows, finished.id)["completion_tokens"] == 3
        for stream in streams:
            row = row_of(rows, stream.id)
            assert (row["status_code"], row["error_code"]) == (200, "server_lost"), row
            # What the server handed its socket layer: the last delta may still sit in Twisted's write buffer
            # when the process dies (it never reaches the client), so the row may hold one event more.
            assert 0 <= row["completion_tokens"] - stream.tokens <= max(1, stream.largest_event), \
                (row, stream.tokens)
        lost = sorted((row["status_code"], row["error_code"], row["completion_tokens"]) for row in rows
                      if row["request_id"] not in {finished.id, *(stream.id for stream in streams)})
        assert lost == [(200, "server_lost", 0), (502, "server_lost", 0)], rows  # the queued stream, the whole answer
        again.wait_for_log("settled 5 requests a dead process left open", 10)  # logged after its rows commit
    finally:
        again.stop()


JOURNAL_CHILD = """
import os, signal, sys
from datetime import datetime, timezone
from teams.ledger import UsageEntry
from teams.usage_journal import Journal

journal = Journal(sys.argv[1], mapped_bytes=int(sys.argv[2]))
def entry(request_id):
    return UsageEntry(request_id=request_id, created_at=datetime.now(timezone.utc), team_id=1, key_id=None,
                      user_id=None, model="m", endpoint="/v1/completions", prompt_tokens=4, completion_tokens=0,
                      time_to_first_token_ms=None, duration_ms=0, status_code=0, finish_reason="", cancelled=False,
                      error_code="")
for request_id in ("cmpl-a", "cmpl-b", "cmpl-c", "cmpl-whole"):
    journal.opened(entry(request_id))
for count in range(1, 301):  # three streams, a frame of one token each in turn
    for request_id in ("cmpl-a", "cmpl-b", "cmpl-c"):
        journal.noted(request_id, count, 12)
    if count == 150:
        journal.closed("cmpl-b")  # its real row went to the spool
journal.noted("cmpl-a", 301, 12)  # the frame about to go out
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("mapped_bytes", [4 << 20, 2048])  # one file; a file filled many times over
def test_a_journal_killed_with_9_holds_every_frame_noted(tmp_path, mapped_bytes):
    """A process killed with -9 right after noting a frame (no flush, no exit): the journal it leaves has that
    frame, the closed request is not settled, the whole answer settles as a 502, and one file is left
    however often it was carried into a fresh one."""
    import subprocess
    import sys

    from teams.usage_journal import abandoned_journals

    child = subprocess.run([sys.executable, "-c", JOURNAL_CHILD, str(tmp_path), str(mapped_bytes)],
                           cwd=Path(__file__).resolve().parent.parent, env={**os.environ, "PYTHONPATH": "."},
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert len(list(tmp_path.glob("journal-*.jsonl"))) == 1
    [(_, rows)] = list(abandoned_journals(tmp_path))
    settled = {row["request_id"]: (row["status_code"], row["completion_tokens"]) for row in rows}
    assert settled == {"cmpl-a": (200, 301), "cmpl-c": (200, 300), "cmpl-whole": (502, 0)}


def test_ten_times_capacity_gets_its_503s_within_a_second_one_log_line_and_a_row_each(hf_cache, tmp_path):
    """10x what the engine runs and queues, at once: every refusal is a 503 `queue_full` within 1 s of its
    request (answered at the door, before Django), none is reset, the log says so once at WARNING (no ERROR
    line per 503), and each refused request has its ledger row, given its key and team."""
    seqs, queue = 2, 4
    clients = 10 * (seqs + queue)
    env = base_env(hf_cache, tmp_path, INFERENCE_MAX_NUM_SEQS=str(seqs), INFERENCE_MAX_QUEUE=str(queue))
    live = LiveServer(env, tmp_path, name="ten-times")

    async def one(http: httpx.AsyncClient, index: int) -> tuple[int, float, str]:
        body = {"model": TINY_MODEL, "prompt": f"Story {index}:", "max_tokens": 16, "ignore_eos": True, "stream": True}
        started = time.monotonic()
        async with http.stream("POST", f"{live.base_url}/v1/completions", headers=live.headers, json=body) as response:
            answered = time.monotonic() - started
            text = "".join([line async for line in response.aiter_lines()])
        return response.status_code, answered, json.loads(text)["error"]["code"] if response.status_code != 200 else ""

    async def everyone() -> list:
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=120, limits=limits) as http:
            return await asyncio.gather(*[one(http, i) for i in range(clients)], return_exceptions=True)

    try:
        load(live)
        outcomes = asyncio.run(everyone())
        failures = [repr(o) for o in outcomes if isinstance(o, BaseException)]
        assert not failures, failures[:3]  # no resets
        refused = [(answered, code) for status, answered, code in outcomes if status == 503]
        print(f"{clients} clients: {len(refused)} 503s, slowest {max(a for a, _ in refused):.2f}s")
        assert len(refused) >= clients - 2 * (seqs + queue)
        assert {code for _, code in refused} == {"queue_full"}
        assert max(answered for answered, _ in refused) < 1.0
        assert all(status in (200, 503) for status, _, _ in outcomes)
        log = live.log()
        assert "ERROR django.request" not in log
        assert 1 <= log.count("answering 503 queue_full") <= 3  # once per burst, not per request
        httpx.post(f"{live.base_url}/v1/completions", headers={"Authorization": "Bearer sk-nobody"}, timeout=30,
                   json={"model": TINY_MODEL, "prompt": "x"})  # not a client: a 401, and no row
        rows = wait_for_rows(lambda: sqlite_rows(tmp_path), clients)
        assert len(rows) == clients
        door = [row for row in rows if row["status_code"] == 503]
        assert len(door) == len(refused) and {row["error_code"] for row in door} == {"queue_full"}
        assert all(row["team_id"] is not None and row["key_id"] is not None for row in door)
    finally:
        live.stop()
