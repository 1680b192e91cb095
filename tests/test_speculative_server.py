"""Speculative decoding through the real server (`serve --speculative-config`, vLLM's JSON) with the openai
SDK: greedy answers are `generate`'s, token for token, with max_tokens and stop ids, streamed or not; usage
bills what the client got; /metrics counts drafts and accepted tokens; a bad config stops the start."""
from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from .conftest import TINY_MODEL
from .live_server import ROOT, LiveServer, base_env, clients

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
PROMPTS = ["one two three four one two three four one two", "a b a b a b a b", "Once upon a time",
           "def f(x): return x + 1\ndef g(x): return f(x) + f(x)\ndef h(x):"]


@pytest.fixture(scope="module")
def spec_server(hf_cache, tmp_path_factory):
    work = tmp_path_factory.mktemp("spec-server")
    live = LiveServer(base_env(hf_cache, work), work, extra_args=("--speculative-config", json.dumps(SPEC)))
    yield live
    live.stop()


def test_greedy_answers_are_generates_and_usage_bills_what_was_sent(spec_server, reference):
    client, _ = clients(spec_server)
    for prompt in PROMPTS:
        expected = reference.greedy(reference.encode(prompt), 40)
        reply = client.completions.create(model=TINY_MODEL, prompt=prompt, max_tokens=40, temperature=0,
                                          extra_body={"return_token_ids": True})
        choice = reply.choices[0]
        assert choice.token_ids == expected, prompt
        assert reply.usage.completion_tokens == len(expected)
        stop_id = expected[9]
        cut = client.completions.create(model=TINY_MODEL, prompt=prompt, max_tokens=40, temperature=0,
                                        extra_body={"return_token_ids": True, "stop_token_ids": [stop_id]})
        assert cut.choices[0].token_ids == expected[:expected.index(stop_id) + 1]
        assert cut.usage.completion_tokens == expected.index(stop_id) + 1
        stream = client.completions.create(model=TINY_MODEL, prompt=prompt, max_tokens=17, temperature=0,
                                           stream=True, stream_options={"include_usage": True})
        chunks = list(stream)
        text = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
        assert text == reference.decode(expected[:17])
        assert chunks[-1].usage.completion_tokens == 17
    several = client.completions.create(model=TINY_MODEL, prompt=PROMPTS[0], max_tokens=20, temperature=0, n=2,
                                        extra_body={"return_token_ids": True})
    expected = reference.greedy(reference.encode(PROMPTS[0]), 20)
    assert [choice.token_ids for choice in several.choices] == [expected, expected]
    metrics = httpx.get(f"{spec_server.base_url}/metrics", headers=spec_server.headers, timeout=30).text
    drafts = [line for line in metrics.splitlines() if line.startswith("vllm:spec_decode_num_drafts_total{")]
    assert drafts and float(drafts[0].split()[-1]) > 0
    assert "inference_spec_decode_mean_accepted_length{" in metrics
    assert 'inference_step_phase_seconds_total{phase="propose"}' in metrics
    assert "speculative decoding on for local/tiny-llama" in spec_server.log()


def test_a_bad_speculative_config_stops_the_start(tmp_path, hf_cache):
    result = subprocess.run([sys.executable, "manage.py", "serve", "--speculative-config", '{"method": "eagle"}'],
                            cwd=ROOT, env=base_env(hf_cache, tmp_path), capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "method 'eagle' is not served" in result.stderr


def test_grammar_sampled_and_penalised_rows_share_steps_with_greedy_rows(spec_server, server):
    """A grammar row and a penalised row (which may speculate too), a sampled row with a seed, beside greedy rows
    that verify drafts: each answer is the one the server without speculation gives (the seeded sample too: its
    draws are its own)."""
    import asyncio

    _, spec_async = clients(spec_server)
    _, plain_async = clients(server)
    requests = [dict(prompt=PROMPTS[0], max_tokens=30, temperature=0),
                dict(prompt=PROMPTS[1], max_tokens=30, temperature=0),
                dict(prompt=PROMPTS[3], max_tokens=30, temperature=0.8, seed=5),
                dict(prompt=PROMPTS[1], max_tokens=30, temperature=0, frequency_penalty=0.5)]
    grammar = dict(messages=[{"role": "user", "content": "Give me a JSON object"}], max_tokens=30, temperature=0,
                   response_format={"type": "json_object"})

    async def answers(client) -> list[str]:
        replies = await asyncio.gather(*(client.completions.create(model=TINY_MODEL, **r) for r in requests),
                                       client.chat.completions.create(model=TINY_MODEL, **grammar))
        return [reply.choices[0].text for reply in replies[:-1]] + [replies[-1].choices[0].message.content]

    assert asyncio.run(answers(spec_async)) == asyncio.run(answers(plain_async))
