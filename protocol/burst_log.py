"""One log line per burst of alike events, not one per event.

An overload or an attack repeats the same event hundreds of times a second (a full queue's 503,
a refused connection); a line for each drowns the log and costs the loop. `BurstLog.note` logs the
first at once, counts the rest, and once `every` seconds have passed logs the next with how many
it stood for.
"""
from __future__ import annotations

import logging
import threading
import time


class BurstLog:
    def __init__(self, logger: logging.Logger, every: float = 10.0, level: int = logging.WARNING) -> None:
        self.logger = logger
        self.every = every
        self.level = level
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def note(self, kind: str, message: str, *args) -> bool:
        """Log `message` for an event of `kind` unless one was logged within `every` seconds; True if logged."""
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(kind, -self.every) < self.every:
                self._held[kind] = self._held.get(kind, 0) + 1
                return False
            held, self._held[kind] = self._held.get(kind, 0), 0
            self._last[kind] = now
        if held:
            message += f" (and {held} more like it since the last such line)"
        self.logger.log(self.level, message, *args)
        return True
