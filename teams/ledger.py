"""The usage ledger's writer: requests hand in their row and go on; a thread writes them in batches.

Usage is never lost: a row is first appended to a durable spool (teams/ledger_spool.py: one line,
flushed, before the response ends), then queued in a bounded queue; the thread inserts up to a
batch at a time, every few hundred milliseconds, trying LEDGER_WRITE_TRIES times with backoff.
Rows that still fail (database down) or that found the queue full stay in the spool and are
replayed into the database, deduplicated by request id, every LEDGER_REPLAY_SECONDS, as are the
segments of a process killed with -9. What is still queued is written at interpreter exit.
Until its batch is committed, each row is also noted in the pending store (teams/pending_usage.py),
which `/v1/key` adds to the database's rows, so usage shows as soon as a response ends.
"""
from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime

from django.conf import settings
from django.db import DataError, IntegrityError, close_old_connections

from protocol import failpoints

from .ledger_dead_letter import database_spool_dir, insert_each
from .ledger_spool import Segment, Spool
from .pending_usage import LocalPending, PendingRow, RedisPending, pending_store
from .usage_journal import Journal, abandoned_journals

logger = logging.getLogger(__name__)


@dataclass
class UsageEntry:
    request_id: str
    created_at: object  # datetime of the request's start
    team_id: int | None
    key_id: int | None
    user_id: int | None
    model: str
    endpoint: str
    prompt_tokens: int
    completion_tokens: int
    time_to_first_token_ms: int | None
    duration_ms: int
    status_code: int
    finish_reason: str
    cancelled: bool
    error_code: str
    tags: dict = field(default_factory=dict)  # the request's metadata, user, safety_identifier, service_tier
    refused: bool = False  # turned away without running (see RequestMeter.finish): not a served request
    # A request answered before its key could be looked up (the database down, the door full): the
    # key's hash, turned into its key, team and user when the row is written (`attribute`).
    key_digest: str = ""
    # The key's visible prefix: what is left to bill a row to once its key and team are deleted.
    key_prefix: str = ""

    def as_model(self):
        """The row as the database stores it (unsaved)."""
        return record_of(asdict(self))

    def pending(self) -> PendingRow | None:
        if self.team_id is None:
            return None
        return PendingRow(self.request_id, self.team_id, self.key_id, self.created_at.timestamp(),
                          self.prompt_tokens, self.completion_tokens, self.refused)


RECORD_FIELDS = frozenset(f.name for f in fields(UsageEntry)) - {"key_digest", "key_prefix"}


def record_of(row: dict):
    """A UsageRecord (unsaved) from a row as the spool or the journal keeps it."""
    from .models import UsageRecord

    values = {name: value for name, value in row.items() if name in RECORD_FIELDS}
    if isinstance(values["created_at"], str):
        values["created_at"] = datetime.fromisoformat(values["created_at"])
    return UsageRecord(**values)


def attribute(rows: list[dict]) -> list[dict]:
    """Rows with a `key_digest` given their key, team and user; dropped when no key has that hash (not a
    client of this server). With auth off, such a row (no key sent) is the default team's."""
    from .models import APIKey
    from .services import default_team

    digests = {row["key_digest"] for row in rows if row.get("key_digest")}
    keys = {key.hashed_key: key for key in APIKey.objects.filter(hashed_key__in=digests)} if digests else {}
    attributed = []
    for row in rows:
        digest = row.get("key_digest")
        if digest is None or row.get("team_id") is not None:
            attributed.append(row)
        elif digest == "" and not settings.INFERENCE.teams.auth_enabled:
            attributed.append({**row, "team_id": default_team().pk})
        elif digest in keys:
            key = keys[digest]
            attributed.append({**row, "team_id": key.team_id, "key_id": key.pk, "user_id": key.user_id})
    return attributed


class LedgerWriter:
    _instance: "LedgerWriter | None" = None
    _lock = threading.Lock()

    def __init__(self, batch_size: int, flush_seconds: float, queue_max: int = 10000, put_wait: float = 1.0,
                 tries: int = 3, spool_dir: str = "", replay_seconds: float = 5.0,
                 pending: LocalPending | RedisPending | None = None) -> None:
        self.batch_size = batch_size
        self.flush_seconds = flush_seconds
        self.put_wait = put_wait
        self.tries = tries
        self.replay_seconds = replay_seconds
        spool_dir = database_spool_dir(spool_dir)  # one spool per database: never replayed into another
        self.spool = Spool(spool_dir)
        self.journal = Journal(spool_dir)
        self.pending = pending or LocalPending()
        self.queue: queue.Queue[tuple[UsageEntry, Segment] | None] = queue.Queue(maxsize=queue_max)
        self._replayed = 0.0
        self.thread = threading.Thread(target=self._run, name="usage-ledger", daemon=True)
        self.thread.start()
        atexit.register(self.close)

    @classmethod
    def get(cls) -> "LedgerWriter":
        with cls._lock:
            if cls._instance is None:
                config = settings.INFERENCE.ledger
                cls._instance = cls(config.batch_size, config.flush_seconds, config.queue_max,
                                    config.put_wait, config.write_tries, config.spool_dir,
                                    config.replay_seconds, pending_store())
            return cls._instance

    def record(self, entry: UsageEntry) -> None:
        """Spool the row, then queue it; a full queue leaves it to the spool's replay (never blocks)."""
        segment = self.spool.append(entry)
        try:
            self.queue.put_nowait((entry, segment))
        except queue.Full:
            self._deferred(entry, segment)

    async def record_async(self, entry: UsageEntry) -> None:
        """`record` with backpressure: a full queue makes the request wait (up to LEDGER_PUT_WAIT) for room.

        The row is noted as pending before it is queued, so `/v1/key` counts it from then on."""
        import asyncio

        segment = self.spool.append(entry)
        await self._note(entry)
        deadline = time.monotonic() + self.put_wait
        while True:
            try:
                self.queue.put_nowait((entry, segment))
                return
            except queue.Full:
                if time.monotonic() >= deadline:
                    self._deferred(entry, segment)
                    return
            try:
                await asyncio.sleep(0.05)
            except BaseException:  # the request was cancelled while it waited: the spool keeps the row
                self._deferred(entry, segment)
                raise

    async def _note(self, entry: UsageEntry) -> None:
        row = entry.pending()
        if row is None:
            return
        try:
            await self.pending.add(row)
        except Exception as exc:  # /v1/key lags until the batch is written; the row itself is safe
            logger.warning("could not note usage row %s as pending: %s", entry.request_id, exc)

    def _deferred(self, entry: UsageEntry, segment: Segment) -> None:
        logger.warning("usage queue full: row %s stays in the spool until it is replayed", entry.request_id)
        self.spool.settled(segment, 1, written=False)

    def close(self, timeout: float = 5.0) -> None:
        try:
            self.queue.put(None, timeout=timeout)
        except queue.Full:
            return  # what is queued is in the spool: the next process replays it
        self.thread.join(timeout)

    def _run(self) -> None:
        while True:
            if time.monotonic() - self._replayed > self.replay_seconds:
                self._replayed = time.monotonic()
                self._replay()
            try:
                item = self.queue.get(timeout=self.replay_seconds)
            except queue.Empty:
                continue
            if item is None:
                return
            batch, stopping = [item], False
            deadline = time.monotonic() + self.flush_seconds
            while len(batch) < self.batch_size and (left := deadline - time.monotonic()) > 0:
                try:
                    item = self.queue.get(timeout=left)
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                    break
                batch.append(item)
            self._write(batch)
            if stopping:
                return

    def _write(self, batch: list[tuple[UsageEntry, Segment]]) -> None:
        """Insert the batch, retried with backoff; then tell the spool each row's fate."""
        from .models import UsageRecord

        written = False
        for attempt in range(self.tries):
            try:
                failpoints.hit("ledger.write")
                close_old_connections()
                rows = attribute([asdict(entry) for entry, _ in batch])
                UsageRecord.objects.bulk_create([record_of(row) for row in rows])
                written = True
                break
            except Exception as exc:  # bookkeeping must never take the server down; the spool keeps the rows
                logger.warning("could not write %d usage rows (try %d of %d): %s", len(batch), attempt + 1,
                               self.tries, exc)
                if attempt + 1 < self.tries:
                    time.sleep(0.2 * 2 ** attempt)
        if not written:
            logger.error("%d usage rows (first: %s) stay in the spool until the database takes them",
                         len(batch), batch[0][0].request_id)
        counts: dict[int, tuple[Segment, int]] = defaultdict(lambda: (None, 0))
        for _, segment in batch:
            counts[id(segment)] = (segment, counts[id(segment)][1] + 1)
        for segment, count in counts.values():
            self.spool.settled(segment, count, written)
        if written:  # rows left to the spool stay noted; readers forget them once a replay commits them
            try:
                self.pending.written(row for entry, _ in batch if (row := entry.pending()) is not None)
            except Exception as exc:  # readers forget committed notes themselves
                logger.warning("could not clear %d pending usage notes: %s", len(batch), exc)

    def _replay(self) -> None:
        """Rows of abandoned or kept spool segments into the database, each at most once; then what dead
        processes' journals left open (after their segments, whose real rows win)."""
        try:
            for path, rows in self.spool.claim_abandoned():
                self._insert_missing(rows, path)
            for path, rows in abandoned_journals(self.spool.directory):
                self._insert_missing(rows, path, "settled %d requests a dead process left open, from %s")
        except Exception as exc:
            logger.warning("could not replay the usage spool yet: %s", exc)

    def _insert_missing(self, rows: list[dict], path, message: str = "replayed %d usage rows from %s") -> None:
        from .models import UsageRecord

        failpoints.hit("ledger.write")
        close_old_connections()
        ids = [row["request_id"] for row in rows]
        present = set(UsageRecord.objects.filter(request_id__in=ids).values_list("request_id", flat=True))
        missing = attribute([row for row in rows if row["request_id"] not in present])
        try:
            UsageRecord.objects.bulk_create([record_of(row) for row in missing])
        except (IntegrityError, DataError, ValueError, TypeError):  # some row refused for good: salvage or dead-letter it, keep the rest
            insert_each(missing, self.spool.directory, path.name, record_of)
        path.unlink(missing_ok=True)
        logger.info(message + " (%d were in already)", len(missing), path.name, len(rows) - len(missing))
