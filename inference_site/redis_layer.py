"""The scale-out channel layer: channels-redis with one round trip per send and batched replies.

Every streamed token crosses the layer once per step per request. channels-redis's `send` makes
four Redis round trips (drop expired, count, add, expire) and its `receive` on a process's own
channels ("name!id": every reply channel of a web process) makes four more per message, one
message at a time under a lock, while all of the process's reply channels share one Redis key. At
64 streams a web process then drained ~1,000 messages/s while the workers offered several times
that: a new request's "started" waited seconds behind other streams' tokens.

Here a send is one Lua script (expire, capacity check, add, expire the key), `send_many` pipelines
many sends into one round trip (the worker's outbox sends a step's messages that way), and one
reader task per Redis key of the process's own channels pops up to `REPLY_BATCH` messages per round
trip and hands each to its channel's receiver. What `send_many` has for one process's own channels
goes as one *bundle* (vLLM's one message per engine step, not one per stream per token): one
serialized entry holding every (channel, message) in order, one script that checks and counts every
channel's capacity, one pop on the web side, which hands each message to its channel. A bundle one of
whose channels is full goes again message by message, so only that channel's messages are refused.
Named channels (the shared worker channel) keep channels-redis's own receive, which never loses a
message to a cancelled reader.

Capacity is per channel, also for a process's own channels that share one Redis key: a send to
one of them counts its messages in a counter key of its own (`<key>#<channel>`), checked against
the capacity in the same script, and a message is counted until its receiver takes it (the counts
taken are subtracted in the reader's next round trip). One slow stream fills only its own channel
(its worker hears ChannelFull for it alone); the others keep their whole capacity.
"""
from __future__ import annotations

import asyncio
import collections
import time
from copy import deepcopy

from channels.exceptions import ChannelFull
from channels_redis.core import RedisChannelLayer
from redis.driver_info import DriverInfo

REPLY_BATCH = 256
# An own channel nobody has received from for this long (its request ended) is dropped with its messages.
STALE_INBOX_SECONDS = 120.0

_SEND = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""
# An own channel ("name!id"): its own count (KEYS[2]) against the capacity, not the shared key's size.
_SEND_OWN = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, ARGV[1])
if tonumber(redis.call('GET', KEYS[2]) or '0') >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[5])
return 1
"""
# A bundle: KEYS[1] the process's key, KEYS[2..] its channels' count keys; ARGV: cutoff, score, body, expiry,
# then each channel's (messages in the bundle, capacity). All or nothing: a channel without room refuses it.
_SEND_BUNDLE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, ARGV[1])
for i = 2, #KEYS do
  local count, capacity = tonumber(ARGV[1 + 2 * i]), tonumber(ARGV[2 + 2 * i])
  if tonumber(redis.call('GET', KEYS[i]) or '0') + count > capacity then return 0 end
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[4])
for i = 2, #KEYS do
  redis.call('INCRBY', KEYS[i], ARGV[1 + 2 * i])
  redis.call('EXPIRE', KEYS[i], ARGV[4])
end
return 1
"""
COUNTED = "__counted__"
BUNDLE = "__bundle__"


class _Inbox:
    """Messages of one own channel, in order, and the receiver waiting for the next one."""

    __slots__ = ("messages", "waiter", "touched")

    def __init__(self) -> None:
        self.messages: collections.deque = collections.deque()
        self.waiter: asyncio.Future | None = None
        self.touched = time.monotonic()


class BatchingRedisChannelLayer(RedisChannelLayer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        driver = DriverInfo()  # its version looked up once: else each new connection reads importlib.metadata (~0.3 ms)
        for host in self.hosts:
            host.setdefault("driver_info", driver)
        self._inboxes: dict[str, _Inbox] = {}
        # One reader per Redis key of own channels ("reply.<id>!", "health.<id>!", ...), running
        # while receivers wait on that key's channels.
        self._readers: dict[str, asyncio.Task] = {}
        self._waiting: collections.Counter[str] = collections.Counter()
        self._last_sweep = time.monotonic()
        self._taken: collections.Counter[str] = collections.Counter()  # own channel -> counted messages taken

    # --- sending ---------------------------------------------------------------
    def _prepared(self, channel: str, message: dict) -> tuple[int, str, bytes]:
        """(connection index, key, serialized message), as channels-redis's send lays them out."""
        assert isinstance(message, dict), "message is not a dict"
        assert self.require_valid_channel_name(channel), "Channel name not valid"
        assert "__asgi_channel__" not in message
        if "!" in channel:
            message = {**message, "__asgi_channel__": channel, COUNTED: True}
            return self.consistent_hash(channel), self.prefix + self.non_local_name(channel), self.serialize(message)
        return next(self._send_index_generator), self.prefix + channel, self.serialize(message)

    def _send_args(self, channel: str, score: float) -> list:
        return [int(time.time()) - int(self.expiry), self.get_capacity(channel), score]

    def _count_key(self, channel: str) -> str:
        return f"{self.prefix}{self.non_local_name(channel)}#{channel}"

    def _eval_send(self, target, key: str, channel: str, score: float, body: bytes):
        if "!" in channel:
            return target.eval(_SEND_OWN, 2, key, self._count_key(channel), *self._send_args(channel, score), body,
                               int(self.expiry))
        return target.eval(_SEND, 1, key, *self._send_args(channel, score), body, int(self.expiry))

    async def send(self, channel: str, message: dict) -> None:
        index, key, body = self._prepared(channel, message)
        sent = await self._eval_send(self.connection(index), key, channel, time.time(), body)
        if not sent:
            raise ChannelFull(channel)

    async def send_many(self, items: list[tuple[str, dict]]) -> list[BaseException | None]:
        """Send each (channel, message) in order, pipelined per Redis server, one process's own channels as one
        bundle; per item None or ChannelFull. A channel's messages keep their order (scores rise by a
        microsecond per entry, a bundle keeps them in order)."""
        outcomes: list[BaseException | None] = [None] * len(items)
        refused = await self._pipelined(items, range(len(items)), outcomes, bundle=True)
        if refused:  # a bundle with a full channel in it: its messages again one by one, in one more round trip
            await self._pipelined(items, refused, outcomes, bundle=False)
        return outcomes

    async def _pipelined(self, items: list[tuple[str, dict]], positions, outcomes: list, bundle: bool) -> list[int]:
        """The items at `positions`, in order, one pipeline per Redis server (where `bundle`, one process's own
        channels as one bundle); a refused message's outcome is ChannelFull. Returned: the positions of refused
        bundles' items."""
        bundled: dict[int, list[int]] = {}  # a bundle's first position -> all of its positions
        if bundle:
            own: dict[str, list[int]] = collections.defaultdict(list)  # a process's key -> positions of its items
            for position in positions:
                if "!" in items[position][0]:
                    own[self.non_local_name(items[position][0])].append(position)
            bundled = {group[0]: group for group in own.values() if len(group) > 1}
        inside = {position for group in bundled.values() for position in group[1:]}
        by_index: dict[int, list[tuple[list[int], str, tuple]]] = collections.defaultdict(list)
        for position in positions:
            if position in inside:
                continue
            channel, message = items[position]
            group = bundled.get(position)
            if group is None:
                index, key, body = self._prepared(channel, message)
                by_index[index].append(([position], channel, (key, body)))
            else:
                by_index[self.consistent_hash(channel)].append((group, channel, self._bundle(items, group)))
        now = time.time()
        refused: list[int] = []
        for index, batch in by_index.items():
            async with self.connection(index).pipeline(transaction=False) as pipe:
                for offset, (group, channel, prepared) in enumerate(batch):
                    if len(group) > 1:
                        pipe.eval(_SEND_BUNDLE, *prepared[0], now + offset * 1e-6, *prepared[1])
                    else:
                        self._eval_send(pipe, prepared[0], channel, now + offset * 1e-6, prepared[1])
                results = await pipe.execute()
            for (group, channel, _), sent in zip(batch, results):
                if sent:
                    continue
                if len(group) > 1:
                    refused.extend(group)
                else:
                    outcomes[group[0]] = ChannelFull(channel)
        return sorted(refused)

    def _bundle(self, items: list[tuple[str, dict]], positions: list[int]) -> tuple[list, list]:
        """(keys and leading args, trailing args) of `_SEND_BUNDLE` for these own-channel items of one process."""
        counts = collections.Counter(items[position][0] for position in positions)
        for position in positions:
            channel, message = items[position]
            assert isinstance(message, dict) and "__asgi_channel__" not in message and BUNDLE not in message
            assert self.require_valid_channel_name(channel)
        body = self.serialize({BUNDLE: [[items[p][0], {**items[p][1], COUNTED: True}] for p in positions]})
        key = self.prefix + self.non_local_name(items[positions[0]][0])
        channels = list(counts)
        keys = [len(channels) + 1, key, *(self._count_key(channel) for channel in channels)]
        per_channel = [value for channel in channels for value in (counts[channel], self.get_capacity(channel))]
        return [*keys, int(time.time()) - int(self.expiry)], [body, int(self.expiry), *per_channel]

    # --- receiving on this process's own channels -----------------------------
    async def receive(self, channel: str) -> dict:
        if "!" not in channel:
            return await super().receive(channel)
        assert self.require_valid_channel_name(channel)
        inbox = self._inboxes.get(channel)
        if inbox is None:
            inbox = self._inboxes[channel] = _Inbox()
        inbox.touched = time.monotonic()
        if inbox.messages:
            return self._take(channel, inbox)
        real_channel = self.non_local_name(channel)
        self._ensure_reader(real_channel)
        inbox.waiter = asyncio.get_running_loop().create_future()
        self._waiting[real_channel] += 1
        try:
            return await inbox.waiter
        finally:
            self._waiting[real_channel] -= 1
            inbox.waiter = None
            if not inbox.messages and self._inboxes.get(channel) is inbox:
                del self._inboxes[channel]

    def receive_ready(self, channel: str) -> list[dict]:
        """An own channel's messages already read from Redis, without waiting (the web side joins a
        stream's queued deltas into one event when it falls behind)."""
        inbox = self._inboxes.get(channel)
        ready = []
        while inbox is not None and inbox.messages:
            ready.append(self._take(channel, inbox))
            inbox = self._inboxes.get(channel)
        return ready

    def _take(self, channel: str, inbox: _Inbox) -> dict:
        message = self._counted(channel, inbox.messages.popleft())
        if not inbox.messages and inbox.waiter is None:
            del self._inboxes[channel]
        return message

    def _ensure_reader(self, real_channel: str) -> None:
        loop = asyncio.get_running_loop()
        reader = self._readers.get(real_channel)
        if reader is not None and not reader.done() and reader.get_loop() is loop:
            return
        self._readers[real_channel] = loop.create_task(self._read_own_channels(real_channel))

    async def _read_own_channels(self, real_channel: str) -> None:
        """Pop this process's messages in batches and hand them out, until an error (given to every
        waiting receiver; the next receive starts a new reader) or no receiver is left."""
        key = self.prefix + real_channel
        index = self.consistent_hash(real_channel)
        try:
            while True:
                connection = self.connection(index)
                if not self._waiting[real_channel]:  # nobody reads on: the counts taken go back now
                    await self._give_back_taken(connection, real_channel)
                    if not self._waiting[real_channel]:
                        break  # no await from this check to the task's end: a new receiver starts a new reader
                    continue
                popped = await self._give_back_taken(connection, real_channel, pop_from=key)
                if not popped:
                    result = await connection.bzpopmin(key, timeout=1)
                    popped = [(result[1], result[2])] if result else []
                for body, _ in popped:
                    self._deliver(self.deserialize(body))
                self._sweep()
        except Exception as exc:
            for channel, inbox in list(self._inboxes.items()):
                if (inbox.waiter is not None and not inbox.waiter.done()
                        and self.non_local_name(channel) == real_channel):
                    inbox.waiter.set_exception(exc)

    async def _give_back_taken(self, connection, real_channel: str, pop_from: str | None = None) -> list:
        """The counts of messages handed out since the last round trip leave their channels' counters, in one
        round trip with the next pop of up to REPLY_BATCH messages from `pop_from` (what it returns)."""
        taken = [(c, n) for c, n in self._taken.items() if self.non_local_name(c) == real_channel]
        if not taken:
            return await connection.zpopmin(pop_from, REPLY_BATCH) if pop_from else []
        async with connection.pipeline(transaction=False) as pipe:
            for channel, n in taken:
                pipe.decrby(self._count_key(channel), n)
            if pop_from:
                pipe.zpopmin(pop_from, REPLY_BATCH)
            results = await pipe.execute()
        for channel, n in taken:
            self._taken[channel] -= n
            if self._taken[channel] <= 0:
                del self._taken[channel]
        return results[-1] if pop_from else []

    def _deliver(self, message: dict) -> None:
        if BUNDLE in message:
            for channel, own in message[BUNDLE]:
                self._deliver_to(channel, own)
            return
        channels = message.pop("__asgi_channel__")
        if not isinstance(channels, list):
            channels = [channels]
        for channel in channels:
            self._deliver_to(channel, message if len(channels) == 1 else deepcopy(message))  # a group send: a copy each

    def _deliver_to(self, channel: str, message: dict) -> None:
        inbox = self._inboxes.get(channel)
        if inbox is None:
            inbox = self._inboxes[channel] = _Inbox()
        if inbox.waiter is not None and not inbox.waiter.done() and not inbox.messages:
            inbox.waiter.set_result(self._counted(channel, message))
        else:
            inbox.messages.append(message)

    def _counted(self, channel: str, message: dict) -> dict:
        """A message handed to its receiver: it no longer counts against its channel's capacity."""
        if message.pop(COUNTED, False):
            self._taken[channel] += 1
        return message

    def _sweep(self) -> None:
        """Drop the messages of own channels nobody reads any more (their requests ended)."""
        now = time.monotonic()
        if now - self._last_sweep < STALE_INBOX_SECONDS / 4:
            return
        self._last_sweep = now
        for channel, inbox in list(self._inboxes.items()):
            if inbox.waiter is None and now - inbox.touched > STALE_INBOX_SECONDS:
                del self._inboxes[channel]  # its count key expires with its last message

    async def close_pools(self) -> None:
        for reader in self._readers.values():
            reader.cancel()
        self._readers.clear()
        await super().close_pools()
