"""Continuous batching: mixed requests in one batch each get exactly what they get alone."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from .conftest import TINY_MODEL
from .live_server import LiveServer, base_env

MIXED = [
    {"prompt": "Once upon a time", "max_tokens": 30, "temperature": 0},
    {"prompt": "The capital of France is", "max_tokens": 25, "temperature": 0.8, "seed": 11, "top_p": 0.9},
    {"prompt": "1, 2, 3,", "max_tokens": 20, "temperature": 1.0, "seed": 5, "extra_body": {"top_k": 20, "min_p": 0.05}},
    {"prompt": "def add(a, b):", "max_tokens": 28, "temperature": 0, "frequency_penalty": 1.5, "presence_penalty": 0.5},
    {"prompt": "Hello there", "max_tokens": 18, "temperature": 0, "extra_body": {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2}},
    {"prompt": "A short story about", "max_tokens": 40, "temperature": 0, "stop": [" the", "\n"]},
    {"prompt": "Numbers:", "max_tokens": 12, "temperature": 0, "logprobs": 2, "echo": True},
    {"prompt": "Two choices", "max_tokens": 15, "temperature": 1.0, "seed": 3, "n": 2},
    {"prompt": "Biased", "max_tokens": 10, "temperature": 0, "logit_bias": {"100": 5.0, "200": -100}},
    {"prompt": "Keep going", "max_tokens": 9, "temperature": 0, "extra_body": {"ignore_eos": True, "min_tokens": 9}},
    {"prompt": [5, 6, 7, 8, 9], "max_tokens": 22, "temperature": 0.7, "seed": 42},
    {"prompt": "Long prompt " * 40, "max_tokens": 16, "temperature": 0},
]


def summary(result) -> tuple[list, list]:
    """(exact parts, logprobs): logprobs may differ by float rounding between batch shapes."""
    exact = [(c.index, c.text, c.finish_reason) for c in result.choices] + [result.usage.completion_tokens]
    logprobs = [c.logprobs.token_logprobs if c.logprobs else None for c in result.choices]
    return exact, logprobs


def assert_same(expected: tuple[list, list], got: tuple[list, list]) -> None:
    assert got[0] == expected[0]
    for want, have in zip(expected[1], got[1]):
        if want is None:
            assert have is None
        else:
            assert [v is None for v in have] == [v is None for v in want]
            assert [v for v in have if v is not None] == pytest.approx([v for v in want if v is not None], abs=1e-3)


def test_mixed_parameters_in_one_batch_match_each_request_alone(client, async_client):
    alone = [summary(client.completions.create(model=TINY_MODEL, **request)) for request in MIXED]

    async def together():
        return await asyncio.gather(*[async_client.completions.create(model=TINY_MODEL, **request) for request in MIXED * 2])

    batched = [summary(result) for result in asyncio.run(together())]
    for expected, got in zip(alone * 2, batched):
        assert_same(expected, got)


def test_streams_that_join_and_leave_mid_batch_match_alone(client, async_client):
    """Requests arrive while others run and finish at different steps (join/leave every step)."""
    lengths = [5, 40, 12, 60, 3, 25, 33, 8]
    prompts = [f"Prompt {i}: once upon a time" for i in range(len(lengths))]
    alone = [client.completions.create(model=TINY_MODEL, prompt=p, max_tokens=n, temperature=0).choices[0].text
             for p, n in zip(prompts, lengths)]

    async def staggered():
        async def one(index):
            await asyncio.sleep(0.01 * index)
            stream = await async_client.completions.create(model=TINY_MODEL, prompt=prompts[index],
                                                           max_tokens=lengths[index], temperature=0, stream=True)
            return "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])

        return await asyncio.gather(*[one(i) for i in range(len(lengths))])

    assert asyncio.run(staggered()) == alone


def test_a_full_queue_answers_503_with_retry_after_at_once(hf_cache, tmp_path):
    env = base_env(hf_cache, tmp_path, INFERENCE_MAX_NUM_SEQS="1", INFERENCE_MAX_QUEUE="1")
    live = LiveServer(env, tmp_path)
    # With one sequence at a time, 8 choices of 480 tokens keep the worker busy for seconds.
    body = {"model": TINY_MODEL, "prompt": "busy", "max_tokens": 480, "ignore_eos": True, "n": 8, "stream": True}
    try:
        with httpx.Client(base_url=live.base_url, headers=live.headers, timeout=60) as http:
            with http.stream("POST", "/v1/completions", json=body) as first, \
                 http.stream("POST", "/v1/completions", json=body) as second:
                assert first.status_code == 200 and second.status_code == 200
                third = http.post("/v1/completions", json=body)
                assert third.status_code == 503
                assert third.headers["Retry-After"] == "1"
                assert third.json()["error"]["code"] == "queue_full"
        # Once the load is gone, the worker takes work again. The closed streams' cancels reach the
        # worker a few ms after the client let go, so a client that honours Retry-After gets in.
        for _ in range(5):
            done = httpx.post(f"{live.base_url}/v1/completions", headers=live.headers, timeout=60,
                              json={"model": TINY_MODEL, "prompt": "calm", "max_tokens": 3})
            if done.status_code != 503:
                break
            time.sleep(float(done.headers["Retry-After"]))
        assert done.status_code == 200
    finally:
        live.stop()
