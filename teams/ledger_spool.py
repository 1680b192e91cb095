"""The usage ledger's durable spool: every row is on disk before it is queued for the database.

A row is appended (one JSON line) to this process's current segment file before `record` returns,
through a shared memory map of the file (`MappedFile`): in the page cache once copied, so a kill -9 of
the web process loses nothing, and no system call per row. A segment is deleted once every row in it
reached the database; one whose rows could not be written (database down past the retries, queue
full) is kept. Each open segment is held with an exclusive `flock`, so any process (this one
included, once the segment is closed) can tell an abandoned segment from a live one:
`claim_abandoned` yields the unlocked ones for replay. Replay inserts the rows whose request id is
not in the ledger yet, so a row is never counted twice.
"""
from __future__ import annotations

import fcntl
import json
import mmap
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

ROTATE_ROWS = 1000  # rows per segment before a new one is opened
SEGMENT_BYTES = 1 << 20  # a segment file's mapped size: 1,000 rows of about 600 bytes fit


class MappedFile:
    """A new locked file (`open_locked`) written through a shared memory map of its `size` bytes.

    A line is in the file (the page cache, which a kill -9 does not take) the moment it is copied, without a
    system call: a write would give up the GIL, and on a busy server the event loop then waits to take it
    back from the engine's thread. The file's blocks are reserved when it is made: a mapped page the disk
    has no room for would kill the process (SIGBUS) at the copy, where a full disk now fails the opening
    with an OSError. The unwritten rest reads as zeros, never as a line (`claim_abandoned` skips it);
    `close` cuts it off.
    """

    def __init__(self, directory: Path, kind: str, size: int) -> None:
        self.path, self.file = open_locked(directory, kind, mapped=True)
        try:
            os.posix_fallocate(self.file.fileno(), 0, size)  # the disk's blocks now; memory only as written
        except OSError:
            self.file.close()
            self.path.unlink(missing_ok=True)
            raise
        self.map = mmap.mmap(self.file.fileno(), size)
        self.end = 0  # where the next line goes

    def fits(self, size: int) -> bool:
        return self.end + size <= len(self.map)

    def put(self, data: bytes) -> None:
        self.map[self.end:self.end + len(data)] = data
        self.end += len(data)

    def close(self, delete: bool = False) -> None:
        """Unmapped and unlocked (a kept file becomes claimable), cut to its lines, or deleted."""
        self.map.close()
        if delete:
            self.path.unlink(missing_ok=True)
        else:
            os.ftruncate(self.file.fileno(), self.end)
        self.file.close()


@dataclass
class Segment:
    path: Path
    file: MappedFile
    rows: int = 0
    written: int = 0
    kept: bool = False  # some row did not reach the database: replay it
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class Spool:
    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock = threading.Lock()
        self._current: Segment | None = None

    def append(self, entry) -> Segment:
        """Write `entry` (a UsageEntry) durably; the segment it went into, to report its fate to."""
        line = (json.dumps(_jsonable(vars(entry))) + "\n").encode()  # a flat dataclass: no deep copy (asdict's)
        with self._lock:
            segment = self._current
            if segment is None or segment.rows >= ROTATE_ROWS or not segment.file.fits(len(line)):
                if segment is not None:
                    self._close(segment)
                segment = self._current = self._open(len(line))
            segment.file.put(line)
            segment.rows += 1
        return segment

    def settled(self, segment: Segment, count: int, written: bool) -> None:
        """`count` rows of `segment` reached the database (`written`) or were given up on (kept for replay)."""
        with self._lock:
            segment.written += count
            segment.kept = segment.kept or not written
            if segment.written >= segment.rows and segment is self._current:
                self._close(segment)
                self._current = None
            elif segment.written >= segment.rows and not segment.closed:
                self._close(segment)

    def _open(self, room: int = 0) -> Segment:
        file = MappedFile(self.directory, "usage", max(SEGMENT_BYTES, 2 * room))
        return Segment(file.path, file)

    def _close(self, segment: Segment) -> None:
        """Closing releases the lock: a kept segment becomes claimable for replay, a done one is deleted."""
        segment.closed = True
        segment.file.close(delete=segment.written >= segment.rows and not segment.kept)

    def claim_abandoned(self) -> Iterator[tuple[Path, list[dict]]]:
        """Segments nobody holds (a dead process's, or this one's kept ones): their rows, with the
        segment still locked until the caller's loop moves on; delete it with `Path.unlink` once replayed."""
        return claim_abandoned(self.directory, "usage-*.jsonl")


def open_locked(directory: Path, kind: str, mapped: bool = False):
    """A new file `<kind>-<pid>-<ns>.jsonl`, locked before it takes a name `claim_abandoned` looks for:
    created under a hidden name, locked, then renamed (the lock stays with the open file). Created, then
    locked under its own name, an empty file could be claimed and deleted by a replay in between.
    Appended to as text, or `mapped`: open to read and write (binary), as a shared memory map needs."""
    name = f"{kind}-{os.getpid()}-{time.time_ns()}.jsonl"
    staging = directory / f".{name}.new"
    if mapped:
        file = os.fdopen(os.open(staging, os.O_RDWR | os.O_CREAT, 0o600), "r+b")
    else:
        file = os.fdopen(os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "a", encoding="utf-8")
    fcntl.flock(file.fileno(), fcntl.LOCK_EX)
    path = directory / name
    os.rename(staging, path)
    return path, file


def claim_abandoned(directory: Path, pattern: str) -> Iterator[tuple[Path, list[dict]]]:
    """Files matching `pattern` that nobody holds: their JSON lines, the file locked until the caller's
    loop moves on (a line cut short by a kill mid-write never was a whole line, and is skipped)."""
    for path in sorted(directory.glob(pattern)):
        try:
            file = open(path, encoding="utf-8")
        except FileNotFoundError:
            continue
        with file:
            try:
                fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live file
            if not path.exists():  # deleted by its owner between glob and lock
                continue
            rows = []
            for line in file:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue
            yield path, rows


def _jsonable(row: dict) -> dict:
    return {key: value.isoformat() if isinstance(value, datetime) else value for key, value in row.items()}
