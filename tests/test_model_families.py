"""Every architecture family people serve, through the real server: greedy output equals `model.generate`.

Each family of workers/tiny/families.py (random weights, its features on: sliding windows of 16 tokens,
alternating layer types, attention sinks, MLA, linear attention, Mamba state, soft-capping, MoE) is served
by one `manage.py serve` with prefill chunks of 64 tokens, so short prompts prefill together in one
padded forward and long ones in chunks. For each: prompts of 4/16/39/179 tokens (the last far past the
window, in three chunks) sent at once and again (the second time from the prefix cache, where the family
allows it), the same four in one request, and one prompt alone, each equal to `generate`; echo +
logprobs with max_tokens 0 within 1e-4 of the model in-process. Then rows paused for interactive work resume
exactly, one family per kind of cache, and a model that fails leaves a healthy model's stream alone.
A new family joins by one line in workers/tiny/families.py.
"""
from __future__ import annotations

import asyncio
import functools
import random
import re

import httpx
import pytest
import torch
from openai import AsyncOpenAI

from workers.tiny.builders import build_tiny_model
from workers.tiny.families import FAMILIES, build_tiny_families
from workers.tiny.type_matrix import build_type_model

from .conftest import Reference
from .live_server import LiveServer, base_env, clients

TOKENS = 16
RANDOM = random.Random(0)
PROMPTS = [[RANDOM.randrange(10, 1000) for _ in range(n)] for n in (4, 16, 39, 179)]
BROKEN = "local/tiny-broken"  # its embedding has 8 rows: a prompt with a larger id fails inside the forward
RECOMPUTED = ["openai-gpt", "xlnet"]  # no cache to continue: the whole text recomputed each token (XLNet: as its
# generate prepares it, a mask token appended to predict)


def model_id(family: str) -> str:
    return f"local/tiny-{family}"


@pytest.fixture(scope="module")
def families_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("families-cache")
    build_tiny_families(list(FAMILIES), cache_dir=cache)
    build_tiny_model(BROKEN, cache_dir=cache, vocab_rows=8)
    for model_type in RECOMPUTED:
        build_type_model(model_type, model_id(model_type), cache)
    return cache


@pytest.fixture(scope="module")
def families_server(families_cache, tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("families-server")
    live = LiveServer(base_env(families_cache, work_dir, INFERENCE_PREFILL_CHUNK="64"), work_dir, name="families")
    yield live
    live.stop()


@functools.cache
def reference_of(cache, family: str) -> Reference:
    return Reference(cache, model_id(family))


@functools.cache
def greedy(cache, family: str, prompt: tuple[int, ...], tokens: int = TOKENS) -> list[int]:
    """What the server gives with ignore_eos: `generate` with EOS held off as long."""
    return reference_of(cache, family).greedy(list(prompt), tokens, min_new_tokens=tokens)


async def complete(client: AsyncOpenAI, model: str, prompt, **options) -> list[list[int]]:
    """Each choice's token ids (return_token_ids), in order of index."""
    response = await client.completions.create(model=model, prompt=prompt, max_tokens=options.pop("max_tokens", TOKENS),
                                               temperature=0, extra_body={"ignore_eos": True, "return_token_ids": True,
                                                                          **options.pop("extra_body", {})}, **options)
    return [token_ids(choice) for choice in sorted(response.choices, key=lambda c: c.index)]


def token_ids(choice) -> list[int]:
    return choice.model_extra.get("token_ids") or []


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_gives_what_generate_gives_alone_batched_and_chunked(families_cache, families_server, family):
    expected = [greedy(families_cache, family, tuple(prompt)) for prompt in PROMPTS]
    _, client = clients(families_server)
    model = model_id(family)

    async def run():
        at_once = await asyncio.gather(*[complete(client, model, [prompt]) for prompt in PROMPTS])
        again = await asyncio.gather(*[complete(client, model, [prompt]) for prompt in PROMPTS])  # prefix-cache hits
        in_one = await complete(client, model, PROMPTS)
        alone = await complete(client, model, [PROMPTS[1]])
        return at_once, again, in_one, alone

    at_once, again, in_one, alone = asyncio.run(run())
    assert [tokens for [tokens] in at_once] == expected, "sent at once"
    assert [tokens for [tokens] in again] == expected, "sent again (prefix cache)"
    assert in_one == expected, "four prompts in one request"
    assert alone == [expected[1]], "alone"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_scores_a_prompt_as_the_model_does(families_cache, families_server, family):
    """echo + logprobs with max_tokens 0: each prompt token's logprob within 1e-4 of the model in-process."""
    assert_scores_prompt_as_the_model_does(families_cache, families_server, family)


def assert_scores_prompt_as_the_model_does(families_cache, families_server, family: str) -> None:
    prompt = PROMPTS[2]
    with torch.no_grad():
        logits = reference_of(families_cache, family).model(torch.tensor([prompt])).logits[0].float()
    expected = torch.log_softmax(logits, dim=-1)[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])].tolist()
    client, _ = clients(families_server)
    response = client.completions.create(model=model_id(family), prompt=[prompt], max_tokens=0, echo=True, logprobs=1)
    scored = response.choices[0].logprobs.token_logprobs
    assert scored[0] is None and len(scored) == len(prompt)
    assert scored[1:] == pytest.approx(expected, abs=1e-4)


# One model per kind of recurrent cache: linear attention + full, Mamba-2 + full, Mamba + full (its layers restart
# on a multi-token forward: a hit's rest goes a token at a time), Mamba alone.
RECURRENT = ["qwen3.5", "bamba", "jamba", "mamba"]


@pytest.mark.parametrize("family", RECURRENT)
def test_a_recurrent_model_reuses_a_shared_prefix_from_its_checkpoint(families_cache, families_server, family):
    """Two prompts with a 123-token prefix: the second's prefill keeps the states where the two part; a third
    with that prefix starts there (`cached_tokens` exactly the prefix), and a next turn of the first starts
    where the first's row ended, past its answer. Every answer equals `generate`."""
    words = random.Random(family)
    prefix = [words.randrange(10, 1000) for _ in range(123)]
    prompts = [prefix + [first] + [words.randrange(10, 1000) for _ in range(8)] for first in (5, 6, 7)]
    client, _ = clients(families_server)

    def send(prompt):
        response = client.completions.create(model=model_id(family), prompt=[prompt], max_tokens=TOKENS, temperature=0,
                                             extra_body={"ignore_eos": True, "return_token_ids": True})
        return token_ids(response.choices[0]), response.usage.prompt_tokens_details.cached_tokens

    answers = [send(prompt) for prompt in prompts]
    prompts.append(prompts[0] + answers[0][0] + [words.randrange(10, 1000) for _ in range(5)])
    answers.append(send(prompts[3]))
    held = len(prompts[0]) + TOKENS - 1  # the first prompt and its answer, but the last token drawn (never fed)
    assert [cached for _, cached in answers] == [0, 0, len(prefix), held]
    for (tokens, _), prompt in zip(answers, prompts):
        assert tokens == greedy(families_cache, family, tuple(prompt))


@pytest.mark.parametrize("model_type", RECOMPUTED)
def test_a_model_without_a_cache_gives_what_generate_gives_alone_and_batched(families_cache, families_server,
                                                                            model_type):
    """Served by recomputing the whole text every token, one row at a time: four prompts at once and in one
    request each equal `generate`, and echo + logprobs of OpenAI GPT (its prompt scored in one forward) within
    1e-4 of the model in-process."""
    expected = [greedy(families_cache, model_type, tuple(prompt)) for prompt in PROMPTS]
    client, async_client = clients(families_server)
    model = model_id(model_type)

    async def run():
        return (await asyncio.gather(*[complete(async_client, model, [prompt]) for prompt in PROMPTS]),
                await complete(async_client, model, PROMPTS))

    at_once, in_one = asyncio.run(run())
    assert [tokens for [tokens] in at_once] == expected, "sent at once"
    assert in_one == expected, "four prompts in one request"
    if model_type == "openai-gpt":
        assert_scores_prompt_as_the_model_does(families_cache, families_server, model_type)
    assert f"{model}: cache of 1 other; without decoding in one batch" in families_server.log()


def preemptions(server: LiveServer) -> float:
    text = httpx.get(f"{server.base_url}/metrics", headers=server.headers, timeout=10).text
    return sum(float(value) for value in re.findall(r"^inference_team_preemptions_total\{[^}]*\} (\S+)$", text, re.M))


# One family per kind of cache: full attention, MLA, every layer sliding, sliding beside full, linear attention
# beside full, Mamba layers beside attention (prefilled whole) and Mamba alone.
PAUSING_FAMILIES = ["llama", "deepseek-v3", "mistral", "gemma3", "qwen3.5", "jamba", "mamba"]


@pytest.mark.parametrize("family", PAUSING_FAMILIES)
def test_rows_paused_for_interactive_work_resume_exactly(families_cache, families_server, family):
    """Batch-class streams (vLLM's priority above 0) pause while an interactive request runs (on CPU none
    run beside it) and resume where they stopped: every one equals `generate`."""
    flex_prompts, tokens = PROMPTS[1:3], 64
    expected = [greedy(families_cache, family, tuple(prompt), tokens) for prompt in flex_prompts]
    expected_interactive = greedy(families_cache, family, tuple(PROMPTS[0]))
    model = model_id(family)
    before = preemptions(families_server)

    async def run():
        async def flex(prompt):
            stream = await async_client.completions.create(
                model=model, prompt=[prompt], max_tokens=tokens, temperature=0, stream=True,
                extra_body={"ignore_eos": True, "return_token_ids": True, "priority": 1})
            ids = []
            async for chunk in stream:
                ids.extend(token_ids(chunk.choices[0]))
                flowing.set()
            return ids

        flowing = asyncio.Event()
        batch = [asyncio.create_task(flex(prompt)) for prompt in flex_prompts]
        await flowing.wait()
        interactive = await complete(async_client, model, [PROMPTS[0]])
        return await asyncio.gather(*batch), interactive

    for _ in range(3):  # on a loaded machine the flex rows may end before the interactive one lands: again
        _, async_client = clients(families_server)  # an async client's pool belongs to one event loop
        flex_ids, interactive = asyncio.run(run())
        assert interactive == [expected_interactive]
        assert flex_ids == expected
        if preemptions(families_server) > before:
            break
    assert preemptions(families_server) > before  # the flex rows were paused


def test_a_failing_model_fails_its_own_requests_and_no_one_else_s(families_cache, families_server):
    """A forward that raises (a broken checkpoint) answers its request with an OpenAI-shaped 500 and leaves
    the stream of a healthy model running beside it untouched (it equals `generate`)."""
    healthy = model_id("llama")
    expected = greedy(families_cache, "llama", tuple(PROMPTS[3]), 200)
    client, async_client = clients(families_server)
    client.completions.create(model=BROKEN, prompt=[[1, 2, 3]], max_tokens=1)  # loaded, and fine with small ids

    async def run():
        flowing = asyncio.Event()

        async def stream():
            response = await async_client.completions.create(
                model=healthy, prompt=[PROMPTS[3]], max_tokens=200, temperature=0, stream=True,
                extra_body={"ignore_eos": True, "return_token_ids": True})
            ids = []
            async for chunk in response:
                ids.extend(token_ids(chunk.choices[0]))
                flowing.set()
            return ids

        healthy_stream = asyncio.create_task(stream())
        await flowing.wait()
        failures = await asyncio.gather(*[async_client.completions.create(model=BROKEN, prompt=f"fails {i} at once",
                                                                          max_tokens=4) for i in range(3)],
                                        return_exceptions=True)
        return await healthy_stream, failures

    ids, failures = asyncio.run(run())
    for failure in failures:
        assert getattr(failure, "status_code", None) == 500, failure
        assert failure.body["code"] == "internal_error" and "Generation failed" in failure.body["message"]
    assert ids == expected
    assert "Traceback" in families_server.log()  # the log says why (the client hears a short reason)
