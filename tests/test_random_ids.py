"""Request ids from the pooled random source: as long as uuid4's hex, never repeated, and never the same in a
forked child as in its parent."""
from __future__ import annotations

import os
import re

from protocol.random_ids import POOL_BYTES, ID_BYTES, random_hex


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
