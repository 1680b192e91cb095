"""What a client saw against what the ledger recorded: a stream that counts the token ids it was sent
(`return_token_ids`), however its connection ends, and the ledger's rows, from SQLite or PostgreSQL."""
from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

import httpx

COLUMNS = "request_id, status_code, error_code, completion_tokens, cancelled, team_id, key_id"


class TokenStream(threading.Thread):
    """A streamed completion: its id, HTTP status, token ids received, and the error event or cut that ended it."""

    def __init__(self, base_url: str, key: str, model: str, max_tokens: int = 400, prompt: str = "Once upon a time",
                 stream: bool = True) -> None:
        super().__init__(daemon=True)
        self.url, self.key = f"{base_url}/v1/completions", key
        self.body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                     "stream": stream, "return_token_ids": True}
        self.id = ""
        self.status = 0
        self.tokens = 0
        self.largest_event = 0  # the most tokens one event brought (what one delta lost in flight may hold)
        self.error: str | None = None  # the error event's code, "cut" (no [DONE]), or None: a whole answer
        self.done = False

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url, json=self.body, timeout=120,
                              headers={"Authorization": f"Bearer {self.key}"}) as response:
                self.status = response.status_code
                if not self.body["stream"] or response.status_code != 200:
                    self._whole(json.loads(response.read()))
                    return
                for line in response.iter_lines():
                    self._line(line)
        except (httpx.HTTPError, ValueError):
            pass
        if self.body["stream"] and self.status == 200 and not self.done and self.error is None:
            self.error = "cut"

    def _whole(self, body: dict) -> None:
        if "error" in body:
            self.error = body["error"]["code"]
            return
        self.id = body["id"]
        self.tokens = sum(len(choice.get("token_ids") or ()) for choice in body["choices"])
        self.done = True

    def _line(self, line: str) -> None:
        if line == "data: [DONE]":
            self.done = True
        elif line.startswith("data: {"):
            chunk = json.loads(line[6:])
            if "error" in chunk:
                self.error = chunk["error"]["code"]
                return
            self.id = self.id or chunk["id"]
            tokens = sum(len(choice.get("token_ids") or ()) for choice in chunk["choices"])
            self.tokens += tokens
            self.largest_event = max(self.largest_event, tokens)

    def wait_for_tokens(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.tokens < count and time.monotonic() < deadline and self.is_alive():
            time.sleep(0.02)
        assert self.tokens >= count, f"{self.id}: only {self.tokens} tokens"


def sqlite_rows(work_dir: Path) -> list[dict]:
    with sqlite3.connect(work_dir / "var" / "db.sqlite3") as db:
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute(f"select {COLUMNS} from teams_usagerecord order by id")]


def postgres_rows(url: str) -> list[dict]:
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(url, row_factory=dict_row) as db:
        return list(db.execute(f"select {COLUMNS} from teams_usagerecord order by id"))


def wait_for_rows(read, count: int, timeout: float = 30) -> list[dict]:
    """`read()`'s rows once there are `count` of them (the ledger writes in batches, replays later)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = read()
        if len(rows) >= count or time.monotonic() > deadline:
            return rows
        time.sleep(0.3)


def row_of(rows: list[dict], request_id: str) -> dict:
    """The one row of `request_id` (a job sent again after its worker died carries `~N`)."""
    found = [row for row in rows if row["request_id"].split("~")[0] == request_id]
    assert len(found) == 1, (request_id, found)
    return found[0]
