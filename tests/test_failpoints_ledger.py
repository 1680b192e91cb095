"""Usage is never lost (real servers, failpoints): database write failures are retried and spooled, a
web process killed with -9 leaves its rows to the next one, a client that leaves between the view and
its stream is settled within seconds, and a failed send from the worker is answered."""
from __future__ import annotations

import os
import signal
import socket
import time

import httpx
import pytest

from .conftest import TINY_MODEL
from .ledger_checks import sqlite_rows, wait_for_rows
from .live_server import LiveServer, base_env
from .teams_setup import make_teams
from .helpers.ledger import complete, ledger_sums, load, wait_for_ledger

pytestmark = pytest.mark.timeout(300)


def client_sums(usages: list[dict]) -> tuple[int, int, int]:
    return len(usages), sum(u["prompt_tokens"] for u in usages), sum(u["completion_tokens"] for u in usages)


def test_a_failing_database_write_is_retried_then_spooled_and_replayed(hf_cache, tmp_path):
    # Three tries per batch: the first batch fails all three and stays in the spool; the replay writes it.
    env = base_env(hf_cache, tmp_path, INFERENCE_FAILPOINTS="ledger.write=raise*3",
                   INFERENCE_LEDGER_REPLAY_SECONDS="1")
    live = LiveServer(env, tmp_path, name="ledger-write")
    try:
        load(live)
        usages = []
        for _ in range(3):
            response, _ = complete(live)
            assert response.status_code == 200, response.text
            usages.append(response.json()["usage"])
        wait_for_ledger(live, client_sums(usages))
        assert "stay in the spool" in live.log()
        live.wait_for_log("replayed", 10)  # logged after its rows commit
    finally:
        live.stop()


def test_rows_of_a_web_process_killed_with_9_reach_the_ledger(hf_cache, tmp_path):
    env = base_env(hf_cache, tmp_path, INFERENCE_FAILPOINTS="ledger.write=raise")  # the database never takes them
    live = LiveServer(env, tmp_path, name="killed")
    usages = []
    try:
        load(live)
        for _ in range(3):
            response, _ = complete(live)
            assert response.status_code == 200, response.text
            usages.append(response.json()["usage"])
    finally:
        os.killpg(live.process.pid, signal.SIGKILL)
        live.process.wait(10)
    assert ledger_sums(live) == (0, 0, 0)
    again = LiveServer(base_env(hf_cache, tmp_path), tmp_path, name="restarted")
    try:
        wait_for_ledger(again, client_sums(usages))
    finally:
        again.stop()


def test_a_client_gone_before_its_stream_started_is_settled_within_seconds(hf_cache, tmp_path):
    env = base_env(hf_cache, tmp_path, INFERENCE_FAILPOINTS="web.handoff=delay(3000)*1")
    live = LiveServer(env, tmp_path, name="handoff")
    try:
        load(live)  # with serve's own key: model control is an operator's act
        secrets = make_teams(env, teams={"solo": ["--max-parallel", "1"]}, keys={"solo": ["--team", "solo"]})
        live.key = secrets["solo"]
        body = (f'{{"model": "{TINY_MODEL}", "prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": true, '
                '"stream": true}').encode()
        with socket.create_connection(("127.0.0.1", live.port)) as sock:  # sends, then leaves during the hand-over
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         + f"Authorization: Bearer {live.key}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            deadline = time.monotonic() + 30
            while "submitted for" not in live.log() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)
        # The one parallel slot comes back within seconds: a later request is served, not refused.
        deadline, response = time.monotonic() + 15, None
        while time.monotonic() < deadline:
            response, _ = complete(live)
            if response.status_code == 200:
                break
            assert response.status_code == 429, response.text
            time.sleep(0.5)
        assert response is not None and response.status_code == 200, response.text
    finally:
        live.stop()


def test_a_failed_send_from_the_worker_is_answered_and_counted(hf_cache, tmp_path):
    env = base_env(hf_cache, tmp_path, INFERENCE_FAILPOINTS="bridge.send=raise*1")
    live = LiveServer(env, tmp_path, name="bridge-send")
    try:
        usages, seen = [], []
        for _ in range(2):
            started = time.monotonic()
            response, _ = complete(live)
            elapsed = time.monotonic() - started
            assert response.status_code in (200, 503), response.text
            if response.status_code == 200:
                usages.append(response.json()["usage"])
                seen.append((200, ""))
            else:
                assert response.json()["error"]["code"] in ("worker_lost", "no_worker")
                seen.append((503, response.json()["error"]["code"]))
            assert elapsed < 60
        assert "failpoint bridge.send fired" in live.log()
        assert "could not deliver" in live.log()
        assert httpx.get(f"{live.base_url}/health", timeout=10).status_code == 200
        response, elapsed = complete(live)
        assert response.status_code == 200 and elapsed < 5, response.text
        usages.append(response.json()["usage"])
        wait_for_ledger(live, client_sums(usages))
        # One row per request, with what its client was answered.
        rows = wait_for_rows(lambda: sqlite_rows(tmp_path), 3)
        assert sorted((row["status_code"], row["error_code"]) for row in rows) == sorted([*seen, (200, "")])
    finally:
        live.stop()
