"""The batch runner: one asyncio task per web process, beside the server (`serve` starts it, and any
Batch API call starts it in a process that has none).

Every BATCH_POLL_SECONDS it beats for the batches it holds and takes over those whose runner has been
silent BATCH_LOST_AFTER seconds (a process that died or was restarted), then runs each held batch:
validate its input, run its pending lines (BATCH_CONCURRENCY at once over every batch of the process,
so a batch never floods the workers' queue; a freed slot starts the next line at once), then write its
output and error files. Everything a restart needs is in the database: a finished line is written
(in a group with the lines that finished beside it) before anything else waits on it, and lines
already done are never run again.
"""
from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections import deque

from channels.db import database_sync_to_async
from django.conf import settings
from django.utils import timezone

from protocol.tasks import watch

from . import service, state
from .lines import batch_principal, record_now, run_line
from .models import Batch

logger = logging.getLogger(__name__)
RUNNER_ID = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
STATE_SECONDS = 0.5  # how often a running batch's status is read (a cancel is seen within this)
READ_AHEAD = 4  # lines read from the database at once, per slot
WRITE_TRIES = 3  # a group of finished lines the database refuses this often is left to run again


def db(function):
    return database_sync_to_async(function, thread_sensitive=False)


class BatchRunner:
    _instance: BatchRunner | None = None

    def __init__(self) -> None:
        self.batches: dict[str, asyncio.Task] = {}
        self.slots = asyncio.Semaphore(max(1, settings.INFERENCE.batches.concurrency))
        self.wake = asyncio.Event()
        self.loop_task: asyncio.Task | None = None

    @classmethod
    def get(cls) -> BatchRunner:
        if cls._instance is None or cls._instance.loop_task is None or cls._instance.loop_task.done():
            cls._instance = cls()
            cls._instance.loop_task = watch(cls._instance.run_forever(), "the batch runner",
                                            lambda reason: None)  # the next API call or tick starts a new one
        return cls._instance

    async def run_forever(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:
                logger.warning("batch runner tick failed", exc_info=True)
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), settings.INFERENCE.batches.poll_seconds)
            except TimeoutError:
                pass

    async def tick(self) -> None:
        held = await db(state.claim_batches)(RUNNER_ID, settings.INFERENCE.batches.lost_after)
        for batch_id in held:
            task = self.batches.get(batch_id)
            if task is None or task.done():
                self.batches[batch_id] = watch(self.run_batch(batch_id), f"batch {batch_id}")
        for batch_id in [b for b, task in self.batches.items() if task.done()]:
            del self.batches[batch_id]

    async def submit(self, batch_id: str) -> None:
        """A batch just created: this process takes it now."""
        await db(state.take_new)(batch_id, RUNNER_ID)
        self.wake.set()

    async def run_batch(self, batch_id: str) -> None:
        current = await db(state.state)(batch_id)
        if current.status == Batch.VALIDATING:
            await db(service.validate_input)(batch_id)
            current = await db(state.state)(batch_id)
        if current.status == Batch.IN_PROGRESS:
            await self.run_lines(batch_id, current)
            current = await db(state.state)(batch_id)
        if current.runner != RUNNER_ID:
            return
        if current.status == Batch.IN_PROGRESS and current.expires_at <= timezone.now():
            await db(state.expire_pending)(batch_id)
            await db(state.finalize)(batch_id, RUNNER_ID, Batch.EXPIRED)
        elif current.status == Batch.IN_PROGRESS:
            await db(state.mark)(batch_id, RUNNER_ID, Batch.FINALIZING, finalizing_at=timezone.now())
            await db(state.finalize)(batch_id, RUNNER_ID, Batch.COMPLETED)
        elif current.status == Batch.FINALIZING:  # a runner died while finalizing
            await db(state.finalize)(batch_id, RUNNER_ID, Batch.COMPLETED)
        elif current.status == Batch.CANCELLING:
            await db(state.finalize)(batch_id, RUNNER_ID, Batch.CANCELLED)
        logger.info("batch %s done", batch_id)

    async def run_lines(self, batch_id: str, current: state.BatchState) -> None:
        """Pending lines, BATCH_CONCURRENCY running per batch (and per process), until none is left, the
        batch is cancelled or expires, or another runner took it.

        A slot that frees starts the next line at once, from lines read ahead (no database round trip
        between one line and the next), and finished lines are written in groups (`LineWriter`), so the
        batch keeps as many requests in flight as a client sending them directly at that concurrency.
        """
        principal = batch_principal(await db(state.principal_of)(current))
        running: dict[asyncio.Task, int] = {}
        ahead: deque[tuple[int, int, str, dict]] = deque()  # read, not started
        writer = LineWriter(batch_id)
        limit = max(1, settings.INFERENCE.batches.concurrency)
        every = min(STATE_SECONDS, settings.INFERENCE.batches.poll_seconds)
        checked = time.monotonic()
        try:
            while True:
                if time.monotonic() - checked >= every:
                    current, checked = await db(state.state)(batch_id), time.monotonic()
                if (current.status != Batch.IN_PROGRESS or current.runner != RUNNER_ID
                        or current.expires_at <= timezone.now()):
                    return
                if len(running) < limit and not ahead:
                    skip = set(running.values()) | writer.unwritten
                    ahead.extend(await db(state.pending_lines)(batch_id, skip, limit * READ_AHEAD))
                while len(running) < limit and ahead:
                    pk, _, custom_id, body = ahead.popleft()
                    task = asyncio.ensure_future(self.one_line(principal, current.endpoint, custom_id, body))
                    running[task] = pk
                if not running:
                    if writer.busy:  # a group it cannot write is left to run again: read the lines once more
                        await writer.flush()
                        continue
                    return
                done, _ = await asyncio.wait(running, timeout=every, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    writer.take(running.pop(task), task)
        finally:
            for task in running:  # cancelled or taken over: lines not done stay pending
                task.cancel()
            if running:
                await asyncio.wait(running)
            for task, pk in running.items():
                writer.take(pk, task)  # those that finished as they were cancelled still count
            # Shielded: a cancel arriving now must not lose finished lines (they would run again).
            await asyncio.shield(writer.flush())

    async def one_line(self, principal, url: str, custom_id: str, body: dict) -> tuple[dict, bool, list]:
        async with self.slots:
            return await run_line(principal, url, custom_id, body)


class LineWriter:
    """Finished lines written to the database in groups: one transaction for every line that finished
    while the previous group was being written (group commit), so a line waits for at most one write
    before it is recorded, and a busy batch costs one commit per group, not per line."""

    def __init__(self, batch_id: str) -> None:
        self.batch_id = batch_id
        self.pending: list[state.LineResult] = []
        self.unwritten: set[int] = set()  # finished here, not yet in the database: not to be read again
        self.writing: asyncio.Task | None = None

    def take(self, pk: int, task: asyncio.Task) -> None:
        if task.cancelled():
            return
        if task.exception() is not None:
            logger.error("batch %s: a line failed", self.batch_id, exc_info=task.exception())
            return
        line, is_error, rows = task.result()
        self.pending.append(state.LineResult(pk, line, is_error, rows))
        self.unwritten.add(pk)
        if self.writing is None or self.writing.done():
            self.writing = asyncio.ensure_future(self._write())

    async def _write(self) -> None:
        while self.pending:
            group, self.pending = self.pending, []
            for attempt in range(WRITE_TRIES):
                try:
                    await db(state.record_lines)(self.batch_id, group)
                    break
                except Exception:
                    logger.warning("batch %s: writing %d lines failed", self.batch_id, len(group), exc_info=True)
                    await asyncio.sleep(0.2 * (attempt + 1))
            else:  # left to run again; the work done is still counted, once, by the ledger writer
                record_now([row for result in group for row in result.rows])
            self.unwritten -= {result.pk for result in group}  # written, or (after the tries) left to run again

    @property
    def busy(self) -> bool:
        return self.writing is not None and not self.writing.done()

    async def flush(self) -> None:
        """Until every line taken so far is written."""
        while self.writing is not None and not self.writing.done():
            await self.writing
        if self.pending:
            self.writing = asyncio.ensure_future(self._write())
            await self.writing


def start_runner() -> BatchRunner:
    """The process's runner, started if it is not running (in the running event loop)."""
    return BatchRunner.get()
