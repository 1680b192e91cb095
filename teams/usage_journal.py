"""Requests under way, on disk: what a web process killed with -9 leaves open is still billed.

A request's usage row reaches the spool (teams/ledger_spool.py) only when the request ends, so a web
process killed mid-stream left no row for its streams, though their clients had been sent tokens.
Here each metered request is noted when its job has started (`opened`: its row as it stands, one
line, flushed at once); the progress of every open request — tokens its client was sent, time to
first token, whether its response had started — goes out once per turn of the event loop, one line
for all that changed in it; and its end (`closed`) once its real row is in the spool. The journal file is held
with `flock` as a spool segment is. The ledger's replay settles a dead process's journal after that
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
        self._open: dict[str, dict] = {}  # request id -> its row as opened, progress merged in at each flush
        self._progress: dict[str, list] = {}  # not yet written: request id -> [completion, ttft_ms, responding]
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

    def progress(self, request_id: str, completion_tokens: int, first_token_ms: int | None, responding: bool) -> None:
        with self._lock:
            if request_id in self._open:
                self._progress[request_id] = [completion_tokens, first_token_ms, responding]
        self._flush_soon()

    def closed(self, request_id: str) -> None:
        """Its real row is in the spool: nothing to settle for it any more."""
        with self._lock:
            if self._open.pop(request_id, None) is not None:
                self._progress.pop(request_id, None)
                self._closed.append(request_id)
        self._flush_soon()

    def _flush_soon(self) -> None:
        """Once per turn of the event loop, for everything noted during it: the journal trails what went
        to the clients by one turn at most, for one write per turn, not one per event."""
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
            if not (self._progress or self._closed):
                return
            for request_id, (completion, first_ms, responding) in self._progress.items():
                self._open[request_id].update(completion_tokens=completion, time_to_first_token_ms=first_ms,
                                              responding=responding)
            self._write({"t": time.time(), "p": self._progress, "c": self._closed})
            self._progress, self._closed = {}, []
            if self._lines >= ROTATE_LINES:
                self._rotate()

    def _write(self, line: dict) -> None:
        if self._file is None:
            self._path, self._file = open_locked(self.directory, "journal")
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()
        self._lines += 1

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
