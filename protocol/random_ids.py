"""Random ids for requests, drawn from the OS's random source a page at a time.

`uuid.uuid4()` asks the OS for 16 bytes each time: a system call, which gives up the GIL, and on a
busy server the event loop then waits to take it back from the engine's thread. Each web request
made two. Here one call fills a pool of `POOL_BYTES` for the next 256 ids: the same source, as
unguessable (a stored response is fetched by its id).
"""
from __future__ import annotations

import os
import threading

POOL_BYTES = 4096
ID_BYTES = 16


class _Pool:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Empty, with a lock of its own (in a forked child the parent's may be held by a thread not copied)."""
        self.lock = threading.Lock()
        self.data, self.at = b"", 0

    def take(self) -> bytes:
        with self.lock:
            if self.at + ID_BYTES > len(self.data):
                self.data, self.at = os.urandom(POOL_BYTES), 0
            piece = self.data[self.at:self.at + ID_BYTES]
            self.at += ID_BYTES
            return piece


_pool = _Pool()
os.register_at_fork(after_in_child=_pool.reset)  # a forked child must never hand out its parent's next ids


def random_hex() -> str:
    """32 hex digits (128 random bits), as `uuid.uuid4().hex` is long."""
    return _pool.take().hex()
