"""The embedded mode's in-memory channel layer: hands messages over, still expires, groups get copies."""
from __future__ import annotations

import asyncio

import pytest
from channels.exceptions import ChannelFull

from inference_site.channel_layers import HandoverInMemoryChannelLayer


def test_messages_arrive_in_order_as_sent_without_copies():
    async def scenario():
        layer = HandoverInMemoryChannelLayer()
        channel = await layer.new_channel("reply.")
        sent = [{"type": "generation.delta", "choices": [{"index": 0, "text": str(i)}]} for i in range(3)]
        for message in sent:
            await layer.send(channel, message)
        return sent, [await layer.receive(channel) for _ in sent]

    sent, received = asyncio.run(scenario())
    assert received == sent and all(a is b for a, b in zip(sent, received))


def test_send_many_delivers_in_order_and_refuses_only_a_full_channels_messages():
    async def scenario():
        layer = HandoverInMemoryChannelLayer(capacity=2)
        busy, free = await layer.new_channel("reply."), await layer.new_channel("reply.")
        items = [(free, {"n": 0}), (busy, {"n": 1}), (busy, {"n": 2}), (free, {"n": 3}), (busy, {"n": 4})]
        outcomes = await layer.send_many(items)  # the busy channel's third is one too many
        return outcomes, layer.receive_ready(free), layer.receive_ready(busy)

    outcomes, free_got, busy_got = asyncio.run(scenario())
    assert outcomes[:4] == [None] * 4 and isinstance(outcomes[4], ChannelFull)
    assert [m["n"] for m in free_got] == [0, 3] and [m["n"] for m in busy_got] == [1, 2]


def test_group_members_each_get_their_own_copy():
    async def scenario():
        layer = HandoverInMemoryChannelLayer()
        first, second = await layer.new_channel(), await layer.new_channel()
        for channel in (first, second):
            await layer.group_add("workers", channel)
        message = {"type": "generation.cancel", "request_id": "cmpl-1"}
        await layer.group_send("workers", message)
        return message, await layer.receive(first), await layer.receive(second)

    message, first, second = asyncio.run(scenario())
    assert first == second == message and first is not second and first is not message


def test_expired_messages_are_dropped_and_a_full_channel_refuses():
    async def scenario():
        layer = HandoverInMemoryChannelLayer(expiry=0.05, capacity=2)
        stale, fresh = await layer.new_channel(), await layer.new_channel()
        await layer.send(stale, {"type": "old"})
        await asyncio.sleep(0.1)
        await layer.send(fresh, {"type": "new"})
        received = await layer.receive(fresh)  # receiving cleans expired messages everywhere
        await layer.send(fresh, {"type": "a"})
        await layer.send(fresh, {"type": "b"})
        with pytest.raises(ChannelFull):
            await layer.send(fresh, {"type": "c"})
        return received, stale in layer.channels

    received, stale_kept = asyncio.run(scenario())
    assert received == {"type": "new"} and not stale_kept


def test_a_channel_keeps_its_queue_while_used_and_an_idle_empty_one_is_forgotten(monkeypatch):
    monkeypatch.setattr("inference_site.channel_layers.CLEAN_INTERVAL_SECONDS", 0.05)

    async def scenario():
        layer = HandoverInMemoryChannelLayer()
        first = asyncio.ensure_future(layer.receive("inference"))  # waits before anything was sent
        await asyncio.sleep(0)
        await layer.send("inference", {"type": "job"})
        assert await asyncio.wait_for(first, 5) == {"type": "job"}
        used, waiting, finished = [await layer.new_channel("reply.") for _ in range(3)]
        await layer.send(used, {"type": "a"})
        queue = layer.channels[used]
        await layer.receive(used)
        await layer.send(used, {"type": "b"})
        kept = layer.channels[used] is queue
        await layer.receive(used)
        await layer.send(finished, {"type": "c"})
        await layer.receive(finished)
        reader = asyncio.ensure_future(layer.receive(waiting))
        await asyncio.sleep(0.1)
        await layer.send(used, {"type": "d"})
        await layer.receive(used)  # the clean runs here: `finished` is empty and nobody waits on it
        remaining = set(layer.channels)
        await layer.send(waiting, {"type": "e"})
        return kept, remaining, (used, waiting, finished), await asyncio.wait_for(reader, 5)

    kept, remaining, (used, waiting, finished), late = asyncio.run(scenario())
    assert kept, "the channel's queue was rebuilt between two messages"
    assert finished not in remaining, "a finished request's empty reply channel was kept"
    assert waiting in remaining and late == {"type": "e"}, "a channel someone waits on was dropped"


def test_bad_channel_names_are_refused():
    with pytest.raises(TypeError):
        asyncio.run(HandoverInMemoryChannelLayer().send("bad name!", {"type": "x"}))
