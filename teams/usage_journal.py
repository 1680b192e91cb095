"""Requests under way, on disk: what a web process killed with -9 leaves open is still billed.

A request's usage row reaches the spool (teams/ledger_spool.py) only when the request ends, so a web
process killed mid-stream left no row for its streams, though their clients had been sent tokens.
Here each metered request is noted when its job has started (`opened`: its row as it stands, one
line, flushed at once); a stream's progress — tokens its client was sent, time to first token — before
each of its frames goes to the socket (`noted`: a line left for the next turn of the event loop let
the socket send a frame first, so a kill between them billed one event short; a whole answer cut off
sent its client nothing, so needs none); and its end (`closed`) once its real row is in the spool.
The journal file is held with `flock` as a spool segment is. The ledger's replay settles a dead process's journal after that
process's spool segments (so a request's real row always wins): each request still open gets a row
from its last progress — status 200 with `server_lost` if its stream had started (the client saw it
cut off), else 502 and no completion tokens (the client got no answer; a proxy in front answers 502
when its upstream dies) — unless its request id is in the ledger already.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from .ledger_spool import _jsonable, claim_abandoned, open_locked

ROTATE_LINES = 20000  # lines before the open requests are carried into a fresh file
LOST_CODE = "server_lost"


class Journal:
    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._lock = threading.Lock()
        self._open: dict[str, dict] = {}  # request id -> its row as opened, its progress merged in
        self._closed: list[str] = []
        self._file = None
        self._path: Path | None = None
        self._lines = 0
        self._flush_due = False

    def opened(self, entry) -> None:
        """`entry` (a UsageEntry) has started: on disk before this returns."""
        row = _jsonable(vars(entry))
        with self._lock:
            self._open[entry.request_id] = row
            self._write({"o": row})

    def noted(self, request_id: str, completion_tokens: int, first_token_ms: int | None) -> None:
        """A stream's frame with `completion_tokens` in all goes to its socket next: on disk before this
        returns (a line built by hand: one per frame, where `json.dumps` cost three times as much)."""
        with self._lock:
            row = self._open.get(request_id)
            if row is None:
                return
            row.update(completion_tokens=completion_tokens, time_to_first_token_ms=first_token_ms, responding=True)
            first_ms = "null" if first_token_ms is None else int(first_token_ms)
            self._write_line(f'{{"t": {time.time()}, "p": {{{json.dumps(request_id)}: '
                             f'[{int(completion_tokens)}, {first_ms}, true]}}}}\n')

    def closed(self, request_id: str) -> None:
        """Its real row is in the spool: nothing to settle for it any more."""
        with self._lock:
            if self._open.pop(request_id, None) is not None:
                self._closed.append(request_id)
        self._flush_soon()

    def _flush_soon(self) -> None:
        """Once per turn of the event loop, for all the requests closed during it."""
        if self._flush_due:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on a loop (a thread of its own): at once
            return self.flush()
        self._flush_due = True
        loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_due = False
        with self._lock:
            if self._closed:
                self._write({"t": time.time(), "c": self._closed})
                self._closed = []

    def _write(self, line: dict) -> None:
        self._write_line(json.dumps(line) + "\n")

    def _write_line(self, text: str) -> None:
        if self._file is None:
            self._path, self._file = open_locked(self.directory, "journal")
        self._file.write(text)
        self._file.flush()
        self._lines += 1
        if self._lines >= ROTATE_LINES:
            self._rotate()

    def _rotate(self) -> None:
        """A fresh file holding only the requests still open; the old one goes once that is on disk."""
        old_path, old_file = self._path, self._file
        self._path, self._file, self._lines = None, None, 0
        for row in self._open.values():
            self._write({"o": row})
        old_file.close()
        old_path.unlink(missing_ok=True)


def unsettled(lines: Iterable[dict]) -> list[dict]:
    """The rows a dead process's journal leaves open, as the ledger should record them."""
    opened: dict[str, dict] = {}
    last_seen = None
    for line in lines:
        if "o" in line:
            opened[line["o"]["request_id"]] = dict(line["o"])
            continue
        last_seen = line.get("t", last_seen)
        for request_id, (completion, first_ms, responding) in (line.get("p") or {}).items():
            if request_id in opened:
                opened[request_id].update(completion_tokens=completion, time_to_first_token_ms=first_ms,
                                          responding=responding)
        for request_id in line.get("c") or ():
            opened.pop(request_id, None)
    rows = []
    for row in opened.values():
        responding = row.pop("responding", False)
        started = row["created_at"]
        row.update(status_code=200 if responding else 502, error_code=LOST_CODE, refused=False,
                   duration_ms=_elapsed_ms(started, last_seen))
        if not responding:  # a whole answer that never left: its client was sent no token
            row.update(completion_tokens=0, time_to_first_token_ms=None)
        rows.append(row)
    return rows


def _elapsed_ms(started_iso: str, last_seen: float | None) -> int:
    from datetime import datetime

    if last_seen is None:
        return 0
    return max(0, int((last_seen - datetime.fromisoformat(started_iso).timestamp()) * 1000))


def abandoned_journals(directory: Path):
    """Dead processes' journals whose spool segments are all replayed: (path, rows to settle), locked."""
    for path, lines in claim_abandoned(directory, "journal-*.jsonl"):
        pid = path.name.split("-")[1]
        if any(directory.glob(f"usage-{pid}-*.jsonl")):
            continue  # that process's real rows first: they win over anything settled here
        yield path, unsettled(lines)
