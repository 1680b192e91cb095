"""A stream whose reader fell behind gets the deltas already waiting on its reply channel joined into one
event (one SSE frame, one write); a reader that keeps up joins nothing. Both real layers: the embedded
in-memory one and the Redis one against a real redis-server."""
from __future__ import annotations

import asyncio

import pytest

import protocol
from inference_site.channel_layers import HandoverInMemoryChannelLayer
from inference_site.redis_layer import BatchingRedisChannelLayer
from openai_api.errors import APIError
from openai_api.generation import JOIN_AT_MOST, GenerationStream


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.scale_out)])
def layers(request):
    """(sender, receiver): one layer for the embedded mode, two processes' layers over Redis."""
    if request.param == "memory":
        layer = HandoverInMemoryChannelLayer()
        return lambda: (layer, layer)
    server = request.getfixturevalue("redis_server")
    return lambda: (BatchingRedisChannelLayer(hosts=[server.url]), BatchingRedisChannelLayer(hosts=[server.url]))


def token(n: int, finish: str | None = None) -> protocol.ChoiceDelta:
    return {"index": 0, "text": f"t{n} ", "token_ids": [n], "logprobs": {"token_logprobs": [-n / 10]},
            "finish_reason": finish}


async def stream_of(sender, receiver) -> tuple[GenerationStream, str]:
    reply = await receiver.new_channel("reply.")
    job = protocol.submit_message("cmpl-joined", reply, protocol.ModelRef.parse("local/tiny-llama"), ["hi"],
                                  protocol.JobParams())
    return GenerationStream(receiver, job), reply


async def close(*layers) -> None:
    for layer in layers:
        if isinstance(layer, BatchingRedisChannelLayer):
            await layer.close_pools()


def test_deltas_waiting_behind_one_are_joined_into_it_and_a_done_ends_the_join(layers):
    async def run():
        sender, receiver = layers()
        stream, reply = await stream_of(sender, receiver)
        for n in range(5):
            await sender.send(reply, protocol.delta_message([token(n)]))
            await sender.send(reply, protocol.alive_message())
        usage = {"prompt_tokens": 1, "completion_tokens": 6}
        await sender.send(reply, protocol.done_message([token(5, "length")], usage))
        events = [event async for event in stream.events()]
        await close(sender, receiver)
        return events

    [event] = asyncio.run(run())
    assert event["type"] == protocol.DONE and event["usage"]["completion_tokens"] == 6
    [choice] = event["choices"]
    assert choice["token_ids"] == list(range(6)) and choice["text"] == "t0 t1 t2 t3 t4 t5 "
    assert choice["logprobs"]["token_logprobs"] == [-n / 10 for n in range(6)] and choice["finish_reason"] == "length"


def test_a_reader_that_keeps_up_gets_every_delta_alone_and_an_error_after_deltas_still_ends_it(layers):
    async def run():
        sender, receiver = layers()
        stream, reply = await stream_of(sender, receiver)
        events = stream.events()
        alone = []
        for n in range(3):
            await sender.send(reply, protocol.delta_message([token(n)]))
            alone.append(await anext(events))
        for n in range(3, 5):
            await sender.send(reply, protocol.delta_message([token(n)]))
        worker_error = protocol.error_message(500, "Generation failed on the worker.", None, "internal_error")
        await sender.send(reply, worker_error)
        rest = []
        with pytest.raises(APIError) as failed:
            while True:
                rest.append(await anext(events))
        await close(sender, receiver)
        return alone, rest, failed.value

    alone, rest, error = asyncio.run(run())
    assert [e["choices"][0]["token_ids"] for e in alone] == [[0], [1], [2]]
    assert [t for e in rest for t in e["choices"][0]["token_ids"]] == [3, 4]  # joined where read together
    assert all(e["type"] == protocol.DELTA for e in rest)
    assert error.status == 500 and error.code == "internal_error"


def test_a_long_backlog_is_joined_in_steps_of_at_most_join_at_most_messages():
    """A stream read very late still moves in steps (the page shows it streaming), each of up to 8 messages."""
    async def run():
        layer = HandoverInMemoryChannelLayer()
        stream, reply = await stream_of(layer, layer)
        for n in range(20):
            await layer.send(reply, protocol.delta_message([token(n)]))
        usage = {"prompt_tokens": 1, "completion_tokens": 21}
        await layer.send(reply, protocol.done_message([token(20, "length")], usage))
        return [event async for event in stream.events()]

    events = asyncio.run(run())
    assert [len(e["choices"][0]["token_ids"]) for e in events] == [JOIN_AT_MOST, JOIN_AT_MOST, 21 - 2 * JOIN_AT_MOST]
    assert [t for e in events for t in e["choices"][0]["token_ids"]] == list(range(21))
    assert [e["type"] for e in events] == [protocol.DELTA, protocol.DELTA, protocol.DONE]
