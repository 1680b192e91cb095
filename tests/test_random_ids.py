"""Request ids from the pooled random source: as long as uuid4's hex, never repeated, and never the same in a
forked child as in its parent."""
from __future__ import annotations

import os
import re
import signal
import threading
import time

from protocol.random_ids import ID_BYTES, POOL_BYTES, random_hex


def test_ids_are_32_hex_digits_and_never_repeat_across_many_pools():
    ids = [random_hex() for _ in range(20 * POOL_BYTES // ID_BYTES)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", value) for value in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_child_draws_ids_of_its_own():
    random_hex()  # the pool is filled and part used: a child that kept it would hand out the parent's next ids
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.write(write, "".join(random_hex() for _ in range(4)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    childs = os.read(read, 4096).decode()
    os.close(read)
    parents = "".join(random_hex() for _ in range(4))
    assert len(childs) == 128 and childs != parents


def test_a_child_forked_while_another_thread_draws_is_not_stuck_on_its_lock():
    from protocol import random_ids

    held, go_on = threading.Event(), threading.Event()

    def holder() -> None:  # a thread inside `take` (its lock held) at the moment of the fork
        with random_ids._pool.lock:
            held.set()
            go_on.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(10)
    child = os.fork()
    if child == 0:
        random_hex()  # with the parent's lock copied held, this would wait for ever
        os._exit(0)
    go_on.set()
    thread.join()
    ended, status = 0, 0
    for _ in range(100):
        ended, status = os.waitpid(child, os.WNOHANG)
        if ended:
            break
        time.sleep(0.05)
    if not ended:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    assert ended and os.waitstatus_to_exitcode(status) == 0, "the child hung on the parent's lock"
