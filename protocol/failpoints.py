"""Failpoints: named places in the real code that a test (or an operator's drill) can make fail.

As etcd's gofail or TiKV's fail-rs: off by default and free when off; switched on by one
environment variable, read once per process:

    INFERENCE_FAILPOINTS="engine.publish=raise*1,ledger.write=raise*3,media.read=delay(2000)"

`name=raise` raises `FailpointError` every time the point is passed, `name=raise*N` the first N
times, `name=raise%P` with a chance of P percent each time (at random, as a soak fires them);
`name=delay(MS)` (or `delay(MS)*N`, `delay(MS)%P`) sleeps MS milliseconds there instead. The names in use
are listed in `POINTS` and in docs/reliability.md. Plain Python: the engine and the web side both
import it.
"""
from __future__ import annotations

import logging
import os
import random
import re
import threading
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)

ENV = "INFERENCE_FAILPOINTS"
POINTS = {
    "engine.loop": "each turn of the engine loop, outside any one request's work",
    "engine.forward": "a model's forward over a prefill (as a model whose forward raises: a degraded model)",
    "engine.publish": "the engine publishing a request's tokens or its end",
    "bridge.send": "the worker carrying a batch of messages onto the channel layer",
    "media.read": "the worker reading a job's images, audio or video",
    "ledger.write": "the web process writing a batch of usage rows to the database",
    "batch.record": "the batch runner writing a group of finished lines (and their usage rows)",
    "worker.heartbeat": "the worker's heartbeat into the catalog",
    "web.handoff": "a generation view, between opening the job and returning its response",
}
ACTION = re.compile(r"^(raise|delay\((\d+)\))(?:\*(\d+)|%(\d+(?:\.\d+)?))?$")


class FailpointError(RuntimeError):
    """Raised where a failpoint set to `raise` fires."""


@dataclass
class _Point:
    delay_ms: int | None  # None: raise
    remaining: int | None  # None: every time
    percent: float | None = None  # fire with this chance each time it is passed


def parse(spec: str) -> dict[str, _Point]:
    """`name=action[*N],…` into points; an unknown name or action is a ValueError (a typo must not pass silently)."""
    points: dict[str, _Point] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, action = item.partition("=")
        match = ACTION.match(action.strip())
        if name.strip() not in POINTS or match is None:
            raise ValueError(f"{ENV}: bad failpoint {item!r} (names: {', '.join(sorted(POINTS))}; "
                             "actions: raise, raise*N, raise%P, delay(MS), delay(MS)*N, delay(MS)%P)")
        points[name.strip()] = _Point(int(match.group(2)) if match.group(2) else None,
                                      int(match.group(3)) if match.group(3) else None,
                                      float(match.group(4)) if match.group(4) else None)
    return points


_lock = threading.Lock()
_chance = random.Random()
_points: dict[str, _Point] | None = None


def configure(spec: str | None) -> None:
    """Set the points from a spec (None: from the environment); for tools and tests in-process."""
    global _points
    with _lock:
        _points = parse(os.environ.get(ENV, "") if spec is None else spec)
        if _points:
            logger.warning("failpoints on: %s", ", ".join(sorted(_points)))


def hit(name: str) -> None:
    """Pass the failpoint `name`: nothing unless it is switched on."""
    point = _take(name)
    if point is None:
        return
    if point.delay_ms is not None:
        time.sleep(point.delay_ms / 1000)
        return
    logger.error("failpoint %s fired", name)
    raise FailpointError(f"failpoint {name} fired")


def _take(name: str) -> _Point | None:
    """The point if it fires this time (counted), else None."""
    if _points is None:
        configure(None)
    point = _points.get(name) if _points else None
    if point is None:
        return None
    if point.percent is not None and _chance.random() * 100 >= point.percent:
        return None
    with _lock:
        if point.remaining is not None:
            if point.remaining <= 0:
                return None
            point.remaining -= 1
    return point


async def ahit(name: str) -> None:
    """`hit` for the event loop: a delay sleeps without blocking it."""
    point = _take(name)
    if point is None:
        return
    if point.delay_ms is not None:
        import asyncio

        await asyncio.sleep(point.delay_ms / 1000)
        return
    logger.error("failpoint %s fired", name)
    raise FailpointError(f"failpoint {name} fired")
