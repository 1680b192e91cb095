"""Completions and ledger reads for the tests that check usage rows against the answers."""
from __future__ import annotations

import sqlite3
import time

import httpx

from ..conftest import TINY_MODEL
from ..live_server import LiveServer


def complete(live: LiveServer, max_tokens: int = 4, **extra) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = httpx.post(f"{live.base_url}/v1/completions", headers=live.headers, timeout=120,
                          json={"model": TINY_MODEL, "prompt": "Once upon a time", "max_tokens": max_tokens,
                                "ignore_eos": True, **extra})
    return response, time.monotonic() - started


def ledger_sums(live: LiveServer, status: int = 200) -> tuple[int, int, int]:
    with sqlite3.connect(live.work_dir / "var" / "db.sqlite3") as db:
        row = db.execute("select count(*), coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0) "
                         "from teams_usagerecord where status_code = ?", (status,)).fetchone()
    return tuple(row)


def wait_for_ledger(live: LiveServer, expected: tuple[int, int, int], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and ledger_sums(live) != expected:
        time.sleep(0.2)
    assert ledger_sums(live) == expected


def load(live: LiveServer) -> None:
    """Start the engine and load the model (a control message: no failpoint fires), so the bound
    on an answer's time measures the fault, not torch's import."""
    with httpx.stream("POST", f"{live.base_url}/load_model", headers=live.headers, json={"model": TINY_MODEL},
                      timeout=120) as response:
        assert response.status_code == 200
        assert '"ready"' in "".join(response.iter_text())
