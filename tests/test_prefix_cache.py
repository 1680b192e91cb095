"""Prefix caching: prompts sharing a start reuse its keys/values, and greedy output is the same as without."""
from __future__ import annotations

import uuid

import pytest
from prometheus_client import REGISTRY

import protocol
from workers.engine.config import EngineConfig
from workers.engine.execution.kv.prefix_cache import BLOCK_TOKENS

from .conftest import TINY_MODEL, engine_running
from .outbox import Outbox
from .helpers.engine import finished

SYSTEM = "You are a careful assistant. Answer briefly and cite the lighthouse keeper's log when you can. " * 2
QUESTIONS = ["What is the capital of France?", "Count to five:", "Once upon a time", "def add(a, b):"]


class RecordingEngine:
    """Jobs on an engine, one at a time; `run_recorded` also records its model's forwards (a torch forward pre-hook)."""

    def __init__(self, engine, outbox: Outbox) -> None:
        self.engine = engine
        self.outbox = outbox
        self.forwards: list[tuple[int, int, int]] = []  # (rows, new columns, cached columns) of each forward

    def run(self, prompts: list[str]) -> dict[int, list[int]]:
        """One job of these prompts (greedy, 12 tokens each): each choice's token ids."""
        reply = f"reply.{uuid.uuid4().hex}"
        self.engine.submit(protocol.submit_message(f"cmpl-{uuid.uuid4().hex}", reply, protocol.ModelRef.parse(TINY_MODEL), prompts,
                                                   protocol.JobParams(temperature=0, max_tokens=12, ignore_eos=True)))
        messages = self.outbox.wait_for(reply, finished)
        assert messages[-1]["type"] == protocol.DONE, messages[-1]
        tokens: dict[int, list[int]] = {}
        for message in messages[1:]:
            for choice in message["choices"]:
                tokens.setdefault(choice["index"], []).extend(choice["token_ids"])
        return tokens

    def run_recorded(self, prompts: list[str]) -> tuple[dict[int, list[int]], list[tuple[int, int, int]]]:
        """`run`, and the forwards that prefilled these prompts (not the decode steps of all of them)."""
        def record(module, args, kwargs):
            past = kwargs.get("past_key_values")
            self.forwards.append((kwargs["input_ids"].shape[0], kwargs["input_ids"].shape[1],
                                  past.get_seq_length() if past is not None else 0))

        (runner,) = self.engine.runners.values()  # the one model loaded
        self.forwards = []
        hook = runner.loaded.model.register_forward_pre_hook(record, with_kwargs=True)
        try:
            answers = self.run(prompts)
        finally:
            hook.remove()
        return answers, [f for f in self.forwards if f[1] > 1 or f[0] != len(prompts)]


def generate_all(hf_cache, prefix_cache_bytes: int) -> tuple[list[list[int]], dict]:
    """The questions one after another (each after the previous one is done), as token ids."""
    outbox = Outbox()
    with engine_running(hf_cache, outbox.emit, EngineConfig(max_num_seqs=4, prefix_cache_bytes=prefix_cache_bytes)) as engine:
        jobs = RecordingEngine(engine, outbox)
        outputs = [jobs.run([SYSTEM + question])[0] for question in QUESTIONS + QUESTIONS[:1]]  # the last repeats a prompt
        return outputs, engine.stats()


def exported(name: str) -> float:
    return REGISTRY.get_sample_value(f"vllm:prefix_cache_{name}_total", {"model_name": TINY_MODEL}) or 0.0


def test_a_shared_prefix_is_reused_and_greedy_output_is_unchanged(hf_cache, reference):
    hits_before, queries_before = exported("hits"), exported("queries")
    cached, stats = generate_all(hf_cache, 64 * 1024 * 1024)
    # /metrics exports the same counts (the hit rate is hits / queries).
    assert exported("hits") - hits_before == stats["prefix_cache_hit_tokens"]
    assert exported("queries") - queries_before == stats["prefix_cache_lookup_tokens"]
    uncached, plain_stats = generate_all(hf_cache, 0)
    assert cached == uncached
    for question, output in zip(QUESTIONS + QUESTIONS[:1], cached):
        assert output == reference.greedy(reference.encode(SYSTEM + question), 12, min_new_tokens=12)
    shared_blocks = len(reference.encode(SYSTEM)) // BLOCK_TOKENS
    assert shared_blocks >= 2
    # Every prompt after the first finds at least the system prompt's full blocks.
    assert stats["prefix_cache_hit_tokens"] >= len(QUESTIONS) * shared_blocks * BLOCK_TOKENS
    assert stats["prefix_cache_lookup_tokens"] == sum(len(reference.encode(SYSTEM + q)) for q in QUESTIONS + QUESTIONS[:1])
    assert stats["prefix_cache_blocks"] > 0 and stats["prefix_cache_bytes"] > 0
    assert plain_stats["prefix_cache_hit_tokens"] == 0


def test_the_cache_stays_within_its_budget(hf_cache, reference):
    config = reference.model.config
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * (config.hidden_size // config.num_attention_heads) * 4
    budget = 3 * BLOCK_TOKENS * per_token  # three blocks
    _, stats = generate_all(hf_cache, budget)
    assert 0 < stats["prefix_cache_bytes"] <= budget


@pytest.fixture
def recording(hf_cache):
    outbox = Outbox()
    with engine_running(hf_cache, outbox.emit, EngineConfig(max_num_seqs=8, prefix_cache_bytes=64 * 1024 * 1024)) as engine:
        yield RecordingEngine(engine, outbox)


def test_prompts_after_equally_long_cached_starts_prefill_in_one_forward_and_match_alone(recording, reference):
    """Newcomers whose cached starts are as long prefill the rest of their prompts together, and each
    answer is still the one `generate` gives that prompt alone."""
    recording.run([SYSTEM + QUESTIONS[0]])  # the system prompt's blocks are cached now
    prompts = [SYSTEM + question for question in QUESTIONS[1:]]
    answers, prefills = recording.run_recorded(prompts)
    shared = len(reference.encode(SYSTEM)) // BLOCK_TOKENS * BLOCK_TOKENS
    assert prefills == [(len(prompts), max(len(reference.encode(p)) - shared for p in prompts), shared)], recording.forwards
    for index, prompt in enumerate(prompts):
        assert answers[index] == reference.greedy(reference.encode(prompt), 12, min_new_tokens=12)


def test_prompts_after_cached_starts_of_other_lengths_prefill_in_one_forward_and_match_alone(recording, reference):
    """A longer cached start and shorter ones (padded to it) prefill together; each answer is still alone's."""
    longer = SYSTEM + QUESTIONS[0] + " Think it over, step by step, and then answer in a single word."
    recording.run([longer])  # its blocks are cached, past the system prompt's
    prompts = [longer + " Answer:", SYSTEM + QUESTIONS[1], SYSTEM + QUESTIONS[2]]
    answers, prefills = recording.run_recorded(prompts)
    shared = len(reference.encode(SYSTEM)) // BLOCK_TOKENS * BLOCK_TOKENS
    assert len(prefills) == 1, recording.forwards
    rows, _, cached_columns = prefills[0]
    assert rows == len(prompts) and shared < cached_columns <= shared + 64  # the short starts were padded
    for index, prompt in enumerate(prompts):
        assert answers[index] == reference.greedy(reference.encode(prompt), 12, min_new_tokens=12)


def test_usage_reports_the_prompt_tokens_the_prefix_cache_served(client, reference):
    """OpenAI's `prompt_tokens_details.cached_tokens` (Responses: `input_tokens_details`): 0 for a prompt the
    server has not seen, then the cached start's tokens (whole blocks, never the whole prompt: its last token is
    always fed) when the same prompt comes again, through chat, completions and Responses."""
    words = " ".join(uuid.uuid4().hex for _ in range(12))  # a start no earlier test sent
    prompt = f"Remember these: {words}. Which came first?"
    first = client.completions.create(model=TINY_MODEL, prompt=prompt, max_tokens=2, temperature=0)
    again = client.completions.create(model=TINY_MODEL, prompt=prompt, max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert again.usage.prompt_tokens == len(reference.encode(prompt)) == first.usage.prompt_tokens
    assert cached % BLOCK_TOKENS == 0 and again.usage.prompt_tokens - BLOCK_TOKENS <= cached < again.usage.prompt_tokens

    messages = [{"role": "user", "content": f"Other words: {words}"}]
    chat = [client.chat.completions.create(model=TINY_MODEL, messages=messages, max_tokens=2, temperature=0)
            for _ in range(2)]
    assert chat[0].usage.prompt_tokens_details.cached_tokens < BLOCK_TOKENS * 2  # the template's start, at most
    assert chat[1].usage.prompt_tokens_details.cached_tokens > chat[0].usage.prompt_tokens_details.cached_tokens
    replies = [client.responses.create(model=TINY_MODEL, input=f"Responses: {words}", max_output_tokens=2)
               for _ in range(2)]
    assert replies[1].usage.input_tokens_details.cached_tokens >= BLOCK_TOKENS
    assert replies[1].usage.input_tokens_details.cached_tokens > replies[0].usage.input_tokens_details.cached_tokens


def test_the_next_turn_starts_past_the_previous_answer(client, reference):
    """A finished row's prompt and answer stay in the prefix cache: a prompt that continues the conversation
    (the earlier prompt, its answer, a new question) reuses every whole block of both, and its answer is still
    `generate`'s."""
    first = reference.encode(f"Notes {uuid.uuid4().hex}: the keeper lit the lamp at dusk and")  # a start no test sent
    reply = client.completions.create(model=TINY_MODEL, prompt=[first], max_tokens=20, temperature=0,
                                      extra_body={"ignore_eos": True, "return_token_ids": True})
    answer = reply.choices[0].model_extra["token_ids"]
    assert len(answer) == 20
    follow_up = first + answer + reference.encode(" Then what?")
    again = client.completions.create(model=TINY_MODEL, prompt=[follow_up], max_tokens=8, temperature=0,
                                      extra_body={"ignore_eos": True, "return_token_ids": True})
    held = len(first) + len(answer) - 1  # the last token drawn was never fed
    assert again.usage.prompt_tokens_details.cached_tokens == held // BLOCK_TOKENS * BLOCK_TOKENS > len(first)
    assert again.choices[0].model_extra["token_ids"] == reference.greedy(follow_up, 8, min_new_tokens=8)
