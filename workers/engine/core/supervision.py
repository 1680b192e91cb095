"""The engine's own account of itself: which jobs it owes an answer, whether its loop is alive.

A failure outside one request's work (the inbox, publishing, grammar checks, metrics) must not
end the engine thread unseen: the loop catches it, answers every job it holds with an
OpenAI-shaped error and goes on (`Supervisor.fault`); after `max_faults` failing turns in a row
the engine is dead (`Supervisor.die`): every job still held is answered, new jobs are refused at
once, and the worker process exits so its supervisor starts a fresh one. Restarting the loop
suits a passing fault (one bad message); exiting suits a broken engine (a corrupted model or
device), where a fresh process is the only sure repair.

Liveness is the engine thread's own heartbeat (each loop turn beats, an idle turn at least once
a second), not the event loop's: the worker's ping reports it and /health reads it.
Plain Python, no Django, no torch.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import protocol

logger = logging.getLogger(__name__)


def engine_fault_message(reason: str) -> dict:
    return protocol.error_message(500, f"The inference engine failed ({reason}); this request was stopped. "
                                       "Retry it.", None, "engine_fault")


def engine_dead_message(reason: str) -> dict:
    return protocol.error_message(503, f"The inference engine on this worker is dead ({reason}); "
                                       "retry shortly.", None, "engine_dead", retry_after=1)


class JobBook:
    """Every job from `submit` until its answer: request id -> reply channel (thread-safe)."""

    def __init__(self) -> None:
        self._jobs: dict[str, str] = {}
        self.lock = threading.RLock()

    def __len__(self) -> int:
        return len(self._jobs)

    def add(self, request_id: str, reply_channel: str) -> None:
        with self.lock:
            self._jobs[request_id] = reply_channel

    def done(self, request_id: str) -> bool:
        """Forget a job that got its answer; False if it was not held (already answered)."""
        with self.lock:
            return self._jobs.pop(request_id, None) is not None

    def take_all(self) -> dict[str, str]:
        with self.lock:
            jobs, self._jobs = self._jobs, {}
        return jobs


class Supervisor:
    """Counts the loop's faults in a row, keeps its heartbeat, and says when the engine is dead."""

    def __init__(self, max_faults: int, stall_seconds: float, on_dead: Callable[[str], None] | None) -> None:
        self.max_faults = max_faults
        self.stall_seconds = stall_seconds
        self.on_dead = on_dead
        self.faults_in_a_row = 0
        self.faults = 0
        self.last_beat = time.monotonic()
        self.dead: str | None = None

    def beat(self) -> None:
        self.last_beat = time.monotonic()

    def turn_ok(self) -> None:
        self.faults_in_a_row = 0

    def fault(self, exc: BaseException) -> bool:
        """Log a failed turn; True while the loop may go on, False once the engine is to die."""
        self.faults += 1
        self.faults_in_a_row += 1
        logger.error("engine loop failed (%d in a row, %d in all): %s; failing the jobs it holds",
                     self.faults_in_a_row, self.faults, exc, exc_info=exc)
        return self.faults_in_a_row < self.max_faults

    def die(self, reason: str) -> None:
        """Mark the engine dead (the jobs it holds are answered next, then `announce`)."""
        self.dead = self.dead or reason
        logger.critical("the inference engine is dead: %s", self.dead)

    def announce(self) -> None:
        """Tell the engine's owner (the worker) that it is dead, once every held job was answered."""
        if self.on_dead is not None and self.dead is not None:
            self.on_dead(self.dead)

    def problem(self, thread: threading.Thread | None) -> str | None:
        """Why the engine is not serving, or None while it is (or has not been started)."""
        if self.dead is not None:
            return f"engine dead: {self.dead}"
        if thread is None:
            return None
        if not thread.is_alive():
            return "engine thread ended"
        silent = time.monotonic() - self.last_beat
        if silent > self.stall_seconds:
            return f"engine stalled: no heartbeat from its loop for {silent:.0f}s"
        return None
