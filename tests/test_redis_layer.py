"""The scale-out channel layer against a real redis-server: order, batches, groups, capacity, faults."""
from __future__ import annotations

import asyncio

import pytest
from channels.exceptions import ChannelFull
from redis import exceptions as redis_exceptions

from inference_site.redis_layer import BatchingRedisChannelLayer

from .services import RedisServer

pytestmark = pytest.mark.scale_out


def layer_for(server: RedisServer, **config) -> BatchingRedisChannelLayer:
    # A process's own channels share one Redis key but each has its own capacity (settings: CHANNEL_CAPACITY).
    return BatchingRedisChannelLayer(hosts=[server.url], **{"capacity": 10_000, **config})


def test_replies_arrive_in_order_per_channel_across_many_channels(redis_server):
    async def run() -> dict[str, list[int]]:
        sender, receiver = layer_for(redis_server), layer_for(redis_server)
        channels = [await receiver.new_channel("reply.") for _ in range(40)]
        items = [(channel, {"type": "t", "n": n}) for n in range(50) for channel in channels]
        assert await sender.send_many(items) == [None] * len(items)  # one pipeline
        await sender.send(channels[0], {"type": "t", "n": 50})  # and a single send after it

        async def drain(channel: str, count: int) -> list[int]:
            return [(await receiver.receive(channel))["n"] for _ in range(count)]

        got = await asyncio.gather(*[drain(channel, 51 if i == 0 else 50) for i, channel in enumerate(channels)])
        await sender.close_pools()
        await receiver.close_pools()
        return dict(zip(channels, got))

    for index, numbers in enumerate(asyncio.run(run()).values()):
        assert numbers == list(range(51 if index == 0 else 50))


def test_a_waiting_receiver_gets_a_message_sent_later_and_group_members_each_get_a_copy(redis_server):
    async def run() -> tuple[dict, dict, dict]:
        sender, receiver = layer_for(redis_server), layer_for(redis_server)
        first, second = await receiver.new_channel("w."), await receiver.new_channel("w.")
        waiting = asyncio.ensure_future(receiver.receive(first))
        await asyncio.sleep(0.2)
        await sender.send(first, {"type": "late", "payload": [1]})
        late = await asyncio.wait_for(waiting, 5)
        await receiver.group_add("members", first)
        await receiver.group_add("members", second)
        await sender.group_send("members", {"type": "cancel", "ids": [1, 2]})
        one, two = await asyncio.gather(receiver.receive(first), receiver.receive(second))
        one["ids"].append(3)  # receivers never share one dict
        await sender.close_pools()
        await receiver.close_pools()
        return late, one, two

    late, one, two = asyncio.run(run())
    assert late == {"type": "late", "payload": [1]}
    assert one == {"type": "cancel", "ids": [1, 2, 3]} and two == {"type": "cancel", "ids": [1, 2]}


def test_own_channels_of_different_prefixes_are_read_side_by_side(redis_server):
    """"reply.<id>!…" and "health.<id>!…" are separate Redis keys: a reader busy on one misses none of the other."""
    async def run() -> tuple[dict, dict]:
        sender, receiver = layer_for(redis_server), layer_for(redis_server)
        reply, health = await receiver.new_channel("reply."), await receiver.new_channel("health.")
        streaming = asyncio.ensure_future(receiver.receive(reply))  # keeps the "reply." reader waiting
        await asyncio.sleep(0.1)
        await sender.send(health, {"type": "pong"})
        pong = await asyncio.wait_for(receiver.receive(health), 5)
        await sender.send(reply, {"type": "delta"})
        delta = await asyncio.wait_for(streaming, 5)
        await sender.close_pools()
        await receiver.close_pools()
        return pong, delta

    assert asyncio.run(run()) == ({"type": "pong"}, {"type": "delta"})


def test_a_full_channel_refuses_only_what_does_not_fit(redis_server):
    async def run() -> list:
        layer = layer_for(redis_server, capacity=3)
        channel = await layer.new_channel("full.")
        outcomes = await layer.send_many([(channel, {"type": "t", "n": n}) for n in range(5)])
        with pytest.raises(ChannelFull):
            await layer.send(channel, {"type": "t", "n": 5})
        received = [(await layer.receive(channel))["n"] for _ in range(3)]
        await layer.close_pools()
        return [type(o).__name__ if o else None for o in outcomes] + received

    assert asyncio.run(run()) == [None, None, None, "ChannelFull", "ChannelFull", 0, 1, 2]


def test_redis_going_away_fails_the_waiting_receivers_and_reading_resumes_when_it_is_back(redis_server):
    async def run() -> dict:
        layer = layer_for(redis_server)
        channel = await layer.new_channel("gone.")
        waiting = asyncio.ensure_future(layer.receive(channel))
        await asyncio.sleep(0.2)
        redis_server.stop()
        with pytest.raises((OSError, redis_exceptions.ConnectionError)):
            await asyncio.wait_for(waiting, 10)
        redis_server.start()
        await layer.send(channel, {"type": "back"})
        message = await asyncio.wait_for(layer.receive(channel), 10)
        await layer.close_pools()
        return message

    assert asyncio.run(run()) == {"type": "back"}


def test_named_channels_keep_channels_redis_receive(redis_server):
    """The shared worker channel: one message goes to one reader, whichever sent it."""
    async def run() -> list[dict]:
        sender, reader = layer_for(redis_server), layer_for(redis_server)
        await sender.send_many([("jobs", {"type": "job", "n": 0}), ("jobs", {"type": "job", "n": 1})])
        got = [await reader.receive("jobs"), await reader.receive("jobs")]
        await sender.close_pools()
        await reader.close_pools()
        return got

    assert [m["n"] for m in asyncio.run(run())] == [0, 1]


def test_one_slow_reply_channel_fills_only_its_own_capacity(redis_server):
    """A process's reply channels share one Redis key; a stream nobody reads must not fill the others."""
    async def run() -> tuple[int, list[int], list[int], bool]:
        sender, receiver = layer_for(redis_server, capacity=5), layer_for(redis_server, capacity=5)
        slow, fast = await receiver.new_channel("reply."), await receiver.new_channel("reply.")
        refused = 0
        for n in range(8):  # the slow stream's client reads nothing
            try:
                await sender.send(slow, {"type": "t", "n": n})
            except ChannelFull:
                refused += 1
        fast_got = []
        for n in range(20):  # the fast one, read as it goes (its reader pops the slow one's messages too)
            await sender.send(fast, {"type": "t", "n": n})
            fast_got.append((await asyncio.wait_for(receiver.receive(fast), 5))["n"])
        slow_got = [(await asyncio.wait_for(receiver.receive(slow), 5))["n"] for _ in range(5)]
        await asyncio.sleep(0.1)
        await sender.send(fast, {"type": "t", "n": 99})  # the reader's next round trip gives the slow one's count back
        await asyncio.wait_for(receiver.receive(fast), 5)
        room_again = False
        for _ in range(40):  # that round trip runs beside this task: within a moment
            try:
                await sender.send(slow, {"type": "t", "n": 5})
                room_again = True
                break
            except ChannelFull:
                await asyncio.sleep(0.05)
        await sender.close_pools()
        await receiver.close_pools()
        return refused, fast_got, slow_got, room_again

    refused, fast_got, slow_got, room_again = asyncio.run(run())
    assert refused == 3 and fast_got == list(range(20)) and slow_got == list(range(5)) and room_again


def test_a_steps_messages_for_one_process_go_as_one_entry_and_count_against_each_channels_capacity(redis_server):
    """vLLM's one message per step: what `send_many` has for one process's own channels is one Redis entry,
    read back into each channel in order; each channel's capacity still counts its own messages, and a
    bundle with a full channel in it refuses only that channel's messages that do not fit."""
    import redis

    async def run() -> tuple:
        sender, receiver = layer_for(redis_server, capacity=4), layer_for(redis_server, capacity=4)
        a, b, c = [await receiver.new_channel("reply.") for _ in range(3)]
        other = await layer_for(redis_server).new_channel("reply.")  # another web process: its own entry
        key = sender.prefix + sender.non_local_name(a)
        client = redis.Redis.from_url(redis_server.url)
        first = [(a, {"type": "t", "n": 0}), (b, {"type": "t", "n": 0}), (other, {"type": "t", "n": 0}),
                 (a, {"type": "t", "n": 1}), ("jobs", {"type": "job"})]
        assert await sender.send_many(first) == [None] * 5
        entries = client.zcard(key)
        third = await sender.send_many([(a, {"type": "t", "n": n}) for n in (2, 3, 4)])  # `a` holds 2 of its 4
        mixed = await sender.send_many([(c, {"type": "t", "n": 0}), (a, {"type": "t", "n": 5}),
                                        (c, {"type": "t", "n": 1}), (a, {"type": "t", "n": 6})])
        got = {channel: [] for channel in (a, b, c)}
        for channel, count in ((a, 4), (b, 1), (c, 2)):
            for _ in range(count):
                got[channel].append((await asyncio.wait_for(receiver.receive(channel), 5))["n"])
        client.close()
        await sender.close_pools()
        await receiver.close_pools()
        return entries, third, mixed, [got[a], got[b], got[c]]

    def named(outcomes: list) -> list:
        return [type(o).__name__ if o else None for o in outcomes]

    entries, third, mixed, got = asyncio.run(run())
    assert entries == 1  # a, b and a again: one entry in the process's key
    assert named(third) == [None, None, "ChannelFull"]
    assert named(mixed) == [None, "ChannelFull", None, "ChannelFull"]  # `a` is full: `c` still gets its own
    assert got == [[0, 1, 2, 3], [0], [0, 1]]
