"""The failpoint switch itself (protocol.failpoints): the spec's grammar, counts and chances."""
from __future__ import annotations

import pytest

from protocol import failpoints


def fires(name: str, times: int) -> int:
    count = 0
    for _ in range(times):
        try:
            failpoints.hit(name)
        except failpoints.FailpointError:
            count += 1
    return count


def test_counted_and_random_failpoints_fire_as_their_spec_says():
    try:
        failpoints.configure("engine.publish=raise*3,ledger.write=raise%25,bridge.send=raise")
        assert fires("engine.publish", 10) == 3
        assert fires("bridge.send", 5) == 5
        assert 150 <= fires("ledger.write", 1000) <= 350  # a quarter, at random
        assert fires("media.read", 10) == 0  # not switched on
    finally:
        failpoints.configure("")


@pytest.mark.parametrize("spec", ["engine.publsh=raise", "engine.publish=explode", "ledger.write=raise%x",
                                  "ledger.write=raise*2%5"])
def test_a_typo_in_the_spec_is_refused(spec):
    with pytest.raises(ValueError):
        failpoints.parse(spec)
