"""A stream's waits on its reply channel (openai_api/silence.py): a wait that hears nothing for the worker's
silence timeout ends in TimeoutError (the stream then treats its worker as lost), however many messages came
before it; a cancellation from elsewhere (a client that left) stays a cancellation."""
from __future__ import annotations

import asyncio

import pytest

from inference_site.channel_layers import HandoverInMemoryChannelLayer
from openai_api.silence import SilenceWatch

TIMEOUT = 0.2


async def _reader(watch: SilenceWatch, layer, channel: str, heard: list) -> None:
    while True:
        heard.append((await watch.receive(layer, channel), asyncio.get_running_loop().time()))


def test_a_silence_after_many_messages_ends_the_wait_after_the_timeout_not_before():
    async def scenario():
        layer, watch, heard = HandoverInMemoryChannelLayer(), SilenceWatch(TIMEOUT), []
        channel = await layer.new_channel("reply.")
        reader = asyncio.ensure_future(_reader(watch, layer, channel, heard))
        for index in range(40):  # 40 messages over 0.6 s: three timeouts' worth, never a silence of one
            await layer.send(channel, {"type": "delta", "index": index})
            await asyncio.sleep(TIMEOUT / 8)
        with pytest.raises(TimeoutError):
            await reader
        silent_for = asyncio.get_running_loop().time() - heard[-1][1]
        return [message["index"] for message, _ in heard], silent_for

    indexes, silent_for = asyncio.run(scenario())
    assert indexes == list(range(40))
    assert TIMEOUT - 0.01 <= silent_for <= 2 * TIMEOUT


def test_a_wait_that_hears_nothing_times_out_and_a_cancel_stays_a_cancel():
    async def scenario():
        layer = HandoverInMemoryChannelLayer()
        channel = await layer.new_channel("reply.")
        began = asyncio.get_running_loop().time()
        with pytest.raises(TimeoutError):
            await SilenceWatch(TIMEOUT).receive(layer, channel)
        waited = asyncio.get_running_loop().time() - began
        watch = SilenceWatch(TIMEOUT)
        waiting = asyncio.ensure_future(watch.receive(layer, channel))
        await asyncio.sleep(TIMEOUT / 4)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await asyncio.sleep(TIMEOUT)  # its timer, still set, finds no wait and does nothing
        again = asyncio.ensure_future(watch.receive(layer, channel))
        await layer.send(channel, {"type": "delta"})
        return waited, await again

    waited, message = asyncio.run(scenario())
    assert TIMEOUT - 0.01 <= waited <= 2 * TIMEOUT
    assert message == {"type": "delta"}
