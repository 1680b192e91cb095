"""The usage ledger's writer: requests hand in their row and go on; a thread writes them in batches.

A row is queued in memory (no I/O on the request path) and the thread inserts up to a batch
at a time, every few hundred milliseconds; what is still queued is written at interpreter exit.
"""
from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
from dataclasses import asdict, dataclass, field

from django.conf import settings
from django.db import close_old_connections

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


class LedgerWriter:
    _instance: "LedgerWriter | None" = None
    _lock = threading.Lock()

    def __init__(self, batch_size: int, flush_seconds: float) -> None:
        self.batch_size = batch_size
        self.flush_seconds = flush_seconds
        self.queue: queue.Queue[UsageEntry | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="usage-ledger", daemon=True)
        self.thread.start()
        atexit.register(self.close)

    @classmethod
    def get(cls) -> "LedgerWriter":
        with cls._lock:
            if cls._instance is None:
                config = settings.INFERENCE
                cls._instance = cls(config["LEDGER_BATCH_SIZE"], config["LEDGER_FLUSH_SECONDS"])
            return cls._instance

    def record(self, entry: UsageEntry) -> None:
        self.queue.put_nowait(entry)

    def close(self, timeout: float = 5.0) -> None:
        self.queue.put(None)
        self.thread.join(timeout)

    def _run(self) -> None:
        while (entry := self.queue.get()) is not None:
            batch, stopping = [entry], False
            deadline = time.monotonic() + self.flush_seconds
            while len(batch) < self.batch_size and (left := deadline - time.monotonic()) > 0:
                try:
                    entry = self.queue.get(timeout=left)
                except queue.Empty:
                    break
                if entry is None:
                    stopping = True
                    break
                batch.append(entry)
            self._write(batch)
            if stopping:
                return

    def _write(self, batch: list[UsageEntry]) -> None:
        from .models import UsageRecord

        try:
            close_old_connections()
            UsageRecord.objects.bulk_create([UsageRecord(**asdict(entry)) for entry in batch])
        except Exception:  # bookkeeping must never take the server down; say what was lost
            logger.exception("could not write %d usage rows (first: %s)", len(batch), batch[0].request_id)
