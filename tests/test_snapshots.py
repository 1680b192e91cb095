"""catalog.snapshots: a kept value is answered while it is read again in the background, never older than its limit."""
from __future__ import annotations

import threading
import time

from catalog.snapshots import Snapshot


class Source:
    """Counts reads; a read can be held until the test lets it go."""

    def __init__(self) -> None:
        self.value = 0
        self.reads = 0
        self.gate = threading.Event()
        self.gate.set()
        self.reading = threading.Event()

    def read(self) -> int:
        self.reads += 1
        self.reading.set()
        assert self.gate.wait(10)
        return self.value


def wait_until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.005)


def test_a_kept_value_is_answered_then_read_again_in_the_background_without_the_caller_waiting():
    source = Source()
    snapshot = Snapshot(source.read, ttl=0.05, stale_limit=30.0, name="test")
    assert snapshot.peek() is None
    assert snapshot.get() == 0 and source.reads == 1
    assert snapshot.get() == 0 and source.reads == 1  # within the ttl: kept
    time.sleep(0.06)
    source.value, source.reading = 1, threading.Event()
    source.gate.clear()  # the background read will hang until let go
    assert snapshot.get() == 0  # stale: answered at once, while the read runs
    assert source.reading.wait(5)
    assert snapshot.get() == 0 and source.reads == 2  # one background read at a time
    source.gate.set()
    wait_until(lambda: snapshot.peek() == 1)
    assert source.reads == 2


def test_a_value_past_its_stale_limit_or_forgotten_is_read_in_place():
    source = Source()
    snapshot = Snapshot(source.read, ttl=0.01, stale_limit=0.05, name="test")
    snapshot.get()
    time.sleep(0.06)
    source.value = 1
    assert snapshot.peek() is None  # too old to answer
    assert snapshot.get() == 1 and source.reads == 2
    source.value = 2
    snapshot.forget()
    assert snapshot.get() == 2 and source.reads == 3
    assert snapshot.get(fresh=True) == 2 and source.reads == 4


def test_a_read_begun_before_forget_is_not_kept():
    source = Source()
    snapshot = Snapshot(source.read, ttl=0.01, stale_limit=30.0, name="test")
    snapshot.get()
    time.sleep(0.02)
    source.gate.clear()
    source.reading = threading.Event()
    snapshot.peek()  # starts the background read, which reads the old value 0 and hangs
    assert source.reading.wait(5)
    source.value = 5
    snapshot.forget()  # this process changed the source meanwhile
    source.gate.set()
    time.sleep(0.05)  # the background read has ended by now
    assert snapshot.peek() is None
    assert snapshot.get() == 5
