"""Wrong bearer keys are throttled; right ones never are.

Every key is looked up, so a valid key is served whatever its address did before. A wrong one counts
against its client address (read through INFERENCE_TRUSTED_PROXIES only, an IPv6 /64 as one:
teams/client_address.py) and against the key's visible prefix (someone trying variations of one key
from many addresses). Once either source has BAD_KEY_LIMIT failures within BAD_KEY_WINDOW seconds,
its wrong keys get 429 with Retry-After instead of 401 until the window has passed.

Guessing is hopeless (keys are long and random), but each try costs a lookup: the lookups of a
throttled source run on a lane of their own (teams/authentication.py), so a flood of wrong keys never
queues ahead of anyone else's, and a key that was valid lately (`recently_valid`) skips that lane.
Counted per web process, in memory.
"""
from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict, deque

from .models import VISIBLE_PREFIX_LENGTH

_lock = threading.Lock()
_failures: dict[str, deque[float]] = {}
_valid: OrderedDict[str, float] = OrderedDict()  # digest of a key that was valid -> when
MAX_SOURCES = 10000  # neither table grows past this; the stalest entries go first
VALID_FOR = 600.0  # seconds a key seen valid skips the lane of throttled sources


def sources(address: str, raw_key: bytes) -> tuple[str, str]:
    """What a wrong key counts against: its client address (bucket) and its visible prefix."""
    return f"address {address}", f"prefix {raw_key[:VISIBLE_PREFIX_LENGTH].decode('latin-1')}"


def _recent(source: str, window: float, now: float) -> deque[float]:
    times = _failures.setdefault(source, deque())
    while times and now - times[0] > window:
        times.popleft()
    return times


def any_failed() -> bool:
    """Whether any wrong key was counted lately (the common case, none: no source to work out)."""
    return bool(_failures)


def refused_for(keys: tuple[str, ...], limit: int, window: float) -> float | None:
    """Seconds until the most throttled of `keys` (sources) may try a wrong key again, or None while all may."""
    now, wait = time.monotonic(), None
    with _lock:
        for source in keys:
            if source not in _failures:
                continue
            times = _recent(source, window, now)
            if len(times) >= limit:
                wait = max(wait or 0.0, window - (now - times[0]), 1.0)
    return wait


def failed(keys: tuple[str, ...], window: float) -> None:
    now = time.monotonic()
    with _lock:
        for source in keys:
            if len(_failures) >= MAX_SOURCES and source not in _failures:
                del _failures[min(_failures, key=lambda s: _failures[s][-1] if _failures[s] else 0)]
            _recent(source, window, now).append(now)


def _digest(raw_key: bytes) -> str:
    return hashlib.blake2b(raw_key, digest_size=16).hexdigest()


def was_valid(raw_key: bytes) -> None:
    """`raw_key` was just found valid: for VALID_FOR seconds its lookups skip the throttled lane."""
    digest, now = _digest(raw_key), time.monotonic()
    with _lock:
        _valid[digest] = now
        _valid.move_to_end(digest)
        while len(_valid) > MAX_SOURCES:
            _valid.popitem(last=False)


def recently_valid(raw_key: bytes) -> bool:
    seen = _valid.get(_digest(raw_key))
    return seen is not None and time.monotonic() - seen < VALID_FOR
