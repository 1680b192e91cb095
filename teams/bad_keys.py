"""Repeated failed bearer keys from one address: after BAD_KEY_LIMIT failures within BAD_KEY_WINDOW
seconds, that address gets 429s (without a key lookup) until the window has passed.

Guessing keys is hopeless (they are long and random), but an address trying many still costs a
database lookup each; this refuses it early. Counted per web process, in memory: with several web
processes an address gets the limit once per process.
"""
from __future__ import annotations

import threading
import time
from collections import deque

_lock = threading.Lock()
_failures: dict[str, deque[float]] = {}
MAX_ADDRESSES = 10000  # the table never grows past this; the stalest addresses go first


def _recent(address: str, window: float, now: float) -> deque[float]:
    times = _failures.setdefault(address, deque())
    while times and now - times[0] > window:
        times.popleft()
    return times


def refused_for(address: str, limit: int, window: float) -> float | None:
    """Seconds until `address` may try again, or None while it may."""
    now = time.monotonic()
    with _lock:
        times = _recent(address, window, now)
        if len(times) < limit:
            return None
        return max(window - (now - times[0]), 1.0)


def failed(address: str, window: float) -> None:
    now = time.monotonic()
    with _lock:
        if len(_failures) >= MAX_ADDRESSES and address not in _failures:
            del _failures[min(_failures, key=lambda a: _failures[a][-1] if _failures[a] else 0)]
        _recent(address, window, now).append(now)
