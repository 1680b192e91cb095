"""Requests under way, on disk: what a web process killed with -9 leaves open is still billed.

A request's usage row reaches the spool (teams/ledger_spool.py) only when the request ends, so a web
process killed mid-stream left no row for its streams, though their clients had been sent tokens.
Here each metered request is noted when its job has started (`opened`: its row as it stands, one
line); a stream's progress — tokens its client was sent, time to first token — before each of its frames
goes to the socket (`noted`: the write-through sends a frame at once, so a note left for later billed one
event short after a kill; a whole answer cut off sent its client nothing, so needs none); and its end
(`closed`) once its real row is in the spool. Every line is in the file as it returns (`Journal`: a
shared memory map), which is held with `flock` as a spool segment is. The ledger's replay settles a dead
process's journal after that process's spool segments (so a request's real row always wins): each
request still open gets a row from its last progress — status 200 with `server_lost` if its stream had
started (the client saw it cut off), else 502 and no completion tokens (the client got no answer; a proxy
in front answers 502 when its upstream dies) — unless its request id is in the ledger already.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from .ledger_spool import MappedFile, _jsonable, claim_abandoned

MAPPED_BYTES = 4 << 20  # a journal file's size; a full one's open requests are carried into a fresh file
LOST_CODE = "server_lost"


class Journal:
    """One web process's journal, a `MappedFile`: a stream notes each frame before it goes out, and a line is
    in the file once copied there, without a system call (one per frame made the engine's thread and the
    event loop hand the GIL to each other once more per frame)."""

    def __init__(self, directory: str | Path, mapped_bytes: int = MAPPED_BYTES) -> None:
        self.directory = Path(directory)
        self.mapped_bytes = mapped_bytes
        self._lock = threading.Lock()
        self._open: dict[str, dict] = {}  # request id -> its row as opened, its progress merged in
        self._quoted: dict[str, str] = {}  # request id -> it as a JSON string
        self._file: MappedFile | None = None  # held open: its flock says the file is live

    def opened(self, entry) -> None:
        """`entry` (a UsageEntry) has started: in the file before this returns."""
        row = _jsonable(vars(entry))
        with self._lock:
            self._open[entry.request_id] = row
            self._quoted[entry.request_id] = json.dumps(entry.request_id)  # once: `noted` writes it per frame
            self._put(json.dumps({"o": row}) + "\n")

    def noted(self, request_id: str, completion_tokens: int, first_token_ms: int | None) -> None:
        """A stream's frame with `completion_tokens` in all goes to its socket next: in the file before this
        returns (a line built by hand: one per frame, where `json.dumps` cost three times as much)."""
        with self._lock:
            row = self._open.get(request_id)
            if row is None:
                return
            row.update(completion_tokens=completion_tokens, time_to_first_token_ms=first_token_ms, responding=True)
            first_ms = "null" if first_token_ms is None else int(first_token_ms)
            self._put(f'{{"t": {time.time()}, "p": {{{self._quoted[request_id]}: '
                      f'[{int(completion_tokens)}, {first_ms}, true]}}}}\n')

    def closed(self, request_id: str) -> None:
        """Its real row is in the spool: nothing to settle for it any more."""
        with self._lock:
            if self._open.pop(request_id, None) is not None:
                self._put(f'{{"t": {time.time()}, "c": [{self._quoted.pop(request_id)}]}}\n')

    def _put(self, line: str) -> None:
        data = line.encode()
        if self._file is None or not self._file.fits(len(data)):
            self._rotate(len(data))
        self._file.put(data)

    def _rotate(self, room: int) -> None:
        """A fresh file holding the requests still open (and `room` bytes more at least); the old one goes
        once they are in it."""
        old = self._file
        carried = "".join(json.dumps({"o": row}) + "\n" for row in self._open.values()).encode()
        self._file = MappedFile(self.directory, "journal", max(self.mapped_bytes, 2 * (len(carried) + room)))
        self._file.put(carried)
        if old is not None:
            old.close(delete=True)


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
