"""Waiting on a reply channel with a deadline: a worker that goes silent is a dead worker.

`receive_within` bounds one wait. A stream reads its channel once per token, so a deadline per wait (an
`asyncio.timeout`: a timer made, pushed on the loop's heap and cancelled) was a sixth of the web side's
CPU per streamed frame. `SilenceWatch` bounds every wait of one stream with one timer per silence period:
set at the first wait, it fires once `timeout` has passed and then either ends a wait that has lasted that
long or moves on to the current wait's own deadline.
"""
from __future__ import annotations

import asyncio


async def receive_within(layer, channel: str, timeout: float) -> dict:
    """layer.receive with a deadline.

    Not asyncio.wait_for: on Python 3.11 it can swallow a cancellation that lands
    as the message arrives, and a vanished client's job would then run to the end.
    """
    async with asyncio.timeout(timeout):
        return await layer.receive(channel)


class SilenceWatch:
    """`receive_within(layer, channel, timeout)` for one channel read again and again (TimeoutError when a
    wait lasts `timeout`); a cancellation from elsewhere stays a cancellation, as with `asyncio.timeout`."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._timer: asyncio.TimerHandle | None = None
        self._waiting: asyncio.Task | None = None
        self._since = 0.0  # loop time the current wait began
        self._cancelling = 0  # the task's cancellation requests when it began
        self._expired = False

    async def receive(self, layer, channel: str) -> dict:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        self._since = loop.time()
        if self._timer is None:
            self._timer = loop.call_at(self._since + self.timeout, self._fire)
        self._waiting, self._cancelling, self._expired = task, task.cancelling(), False
        try:
            return await layer.receive(channel)
        except asyncio.CancelledError:
            if self._expired and task.uncancel() <= self._cancelling:
                raise TimeoutError from None
            raise
        finally:
            self._waiting = None

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        if self._waiting is None:  # between waits: the next one sets the timer again
            return
        due = self._since + self.timeout
        loop = asyncio.get_running_loop()
        if loop.time() < due:
            self._timer = loop.call_at(due, self._fire)
            return
        self._expired = True
        self._waiting.cancel()
