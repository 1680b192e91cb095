"""The embedded mode's channel layer: Channels' in-memory layer without its per-message costs.

Every streamed token crosses the layer once per step per request, so its Python cost
competes with the model for the same cores. Channels' InMemoryChannelLayer deep-copies
each message, scans every channel for expired messages on each receive, and builds a new
queue for every receive and (having dropped the emptied one) for the next send; this one
hands messages over as they are, keeps a channel's queue while it is in use, and cleans up
expired messages and idle empty queues at most once a second.
"""
from __future__ import annotations

import asyncio
import time
from copy import deepcopy

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer

CLEAN_INTERVAL_SECONDS = 1.0


class HandoverInMemoryChannelLayer(InMemoryChannelLayer):
    """Messages are handed over, not copied: a sender must not change a message after sending it.

    (The Redis layer serializes each message, so code that keeps to this works on both.)
    """

    _last_clean = 0.0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._receivers: dict[str, int] = {}  # channel -> receives waiting on it (its queue stays)

    async def send(self, channel: str, message: dict) -> None:
        self._put(channel, message, time.time() + self.expiry)

    async def send_many(self, items: list[tuple[str, dict]]) -> list[BaseException | None]:
        """Each (channel, message) in order, as the Redis layer's `send_many`: per item None or the error
        (ChannelFull); a worker's step of messages in one call, not an await each."""
        expires, outcomes = time.time() + self.expiry, []
        for channel, message in items:
            try:
                self._put(channel, message, expires)
                outcomes.append(None)
            except Exception as exc:
                outcomes.append(exc)
        return outcomes

    def _put(self, channel: str, message: dict, expires: float) -> None:
        assert isinstance(message, dict), "message is not a dict"
        queue = self.channels.get(channel)
        if queue is None:
            self.require_valid_channel_name(channel)
            queue = self.channels.setdefault(channel, asyncio.Queue(maxsize=self.get_capacity(channel)))
        try:
            queue.put_nowait((expires, message))
        except asyncio.QueueFull:
            raise ChannelFull(channel) from None

    async def receive(self, channel: str) -> dict:
        self._clean_expired()  # first: it drops empty queues nobody waits on yet, this one included
        queue = self.channels.get(channel)
        if queue is None:
            self.require_valid_channel_name(channel)
            queue = self.channels.setdefault(channel, asyncio.Queue(maxsize=self.get_capacity(channel)))
        if not queue.empty():
            return queue.get_nowait()[1]
        self._receivers[channel] = self._receivers.get(channel, 0) + 1
        try:
            return (await queue.get())[1]
        finally:
            waiting = self._receivers.pop(channel) - 1
            if waiting:
                self._receivers[channel] = waiting

    def receive_ready(self, channel: str) -> list[dict]:
        """The channel's messages that have already arrived, without waiting (the web side joins a
        stream's queued deltas into one event when it falls behind)."""
        queue = self.channels.get(channel)
        if queue is None:
            return []
        now, ready = time.time(), []
        while not queue.empty():
            expires, message = queue.get_nowait()
            if expires >= now:
                ready.append(message)
        return ready

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._last_clean >= CLEAN_INTERVAL_SECONDS:
            self._last_clean = now
            super()._clean_expired()
            for channel, queue in list(self.channels.items()):  # a finished request's reply channel
                if queue.empty() and channel not in self._receivers:
                    del self.channels[channel]

    async def group_send(self, group: str, message: dict) -> None:
        """Each member gets its own copy: receivers must never share one dict."""
        self.require_valid_group_name(group)
        self._clean_expired()
        for channel in list(self.groups.get(group, {})):
            try:
                await self.send(channel, deepcopy(message))
            except ChannelFull:
                pass
