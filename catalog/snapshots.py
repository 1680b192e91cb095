"""A value read from a slow source (the database, a disk scan), kept a couple of seconds.

Requests ask the catalog what a model name means on every generation; reading it again in
their path cost a request 5-17 ms every couple of seconds on an idle box and up to 90 ms beside
a flood of streams (issue 24's trace). So after `ttl` seconds the value is still answered for up
to `stale_limit` seconds while one background thread reads it again: while requests keep
coming none of them waits for a read, and none sees a value older than `stale_limit`. An
older value, or none yet, is read in place. `forget()` (this process changed the source) makes
the next `get()` read in place, and drops any read that began before it.
Plain Python: no Django here (a reader that uses the database closes its connection itself).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Snapshot(Generic[T]):
    def __init__(self, read: Callable[[], T], ttl: float, stale_limit: float, name: str,
                 after_background_read: Callable[[], None] | None = None) -> None:
        self._read_source = read
        self.ttl, self.stale_limit, self.name = ttl, stale_limit, name
        self._after_background_read = after_background_read
        self._lock = threading.Lock()
        self._value: T | None = None
        self._stamp: float | None = None  # when the kept value's read began; None: nothing kept
        self._generation = 0  # bumped by forget(): a read begun before it is not kept
        self._refreshing = False

    def get(self, fresh: bool = False) -> T:
        """The value: the kept one unless `fresh`, it is missing or older than `stale_limit`."""
        if not fresh:
            kept = self.peek()
            if kept is not None:
                return kept
        return self._read()

    def peek(self) -> T | None:
        """The kept value if it may still be answered (a stale one starts its background read), else None."""
        with self._lock:
            if self._stamp is None:
                return None
            age = time.monotonic() - self._stamp
            if age > self.stale_limit:
                return None
            if age > self.ttl and not self._refreshing:
                self._refreshing = True
                threading.Thread(target=self._refresh, name=f"refresh {self.name}", daemon=True).start()
            return self._value

    def forget(self) -> None:
        with self._lock:
            self._generation += 1
            self._stamp = None

    def _read(self) -> T:
        with self._lock:
            generation = self._generation
        began = time.monotonic()
        value = self._read_source()
        with self._lock:
            if generation == self._generation and (self._stamp is None or self._stamp < began):
                self._value, self._stamp = value, began
        return value

    def _refresh(self) -> None:
        try:
            self._read()
        except Exception as exc:  # the kept value ages out, and the next request past the limit reads in place
            # One line per attempt (a database outage tries again at each request's look): the reason, no traceback.
            logger.warning("reading %s again failed (%s: %s); the kept one is answered until it is %.0f s old",
                           self.name, type(exc).__name__, exc, self.stale_limit)
        finally:
            with self._lock:
                self._refreshing = False
            if self._after_background_read is not None:
                self._after_background_read()
