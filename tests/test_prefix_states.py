"""Prefix reuse for models that keep recurrent states (linear attention, Mamba): checkpoints of the states.

A recurrent state has no per-token entries to cut into blocks, so the prefix cache keeps a copy of
every state where a prompt ended and where a prompt's blocks parted from a cached one's
(workers/engine/execution/kv/prefix_cache.py). For one model per kind — linear attention + full (Qwen3.5),
Mamba-2 + full (Bamba), Mamba + full whose layers restart on a multi-token forward (Jamba), Mamba alone —
and a full-attention model beside them: the tokens a hit reports (`cached_tokens`) are exactly those
whose keys/values and states were reused, the logits after a hit are the model's own on the whole prompt,
and greedy output equals `generate`.
"""
from __future__ import annotations

import random

import pytest
import torch

from workers.engine.execution.kv.prefix_cache import BLOCK_TOKENS, PrefixCache
from workers.engine.execution.kv.rows import RowState, cache_from_layers
from workers.engine.execution.prefix_reuse import STEPWISE_REST

from .helpers.scheduler_harness import Harness

FAMILIES = ["qwen3.5", "bamba", "jamba", "mamba", "llama"]
PREFIX = " ".join("the lighthouse keeper wrote in his log every night about ships storms and gulls".split() * 8)
QUESTIONS = [" Question one: what happened?", " Question two: who was there?", " Question three: when?"]
LONG_QUESTION = " Question four: " + " ".join(f"and what about the ship called number {n}?" for n in range(12))


@pytest.fixture(scope="module")
def states_cache(tmp_path_factory):
    from workers.tiny.families import build_tiny_families

    cache = tmp_path_factory.mktemp("prefix-states")
    build_tiny_families(FAMILIES, cache_dir=cache)
    return cache


def parting(first: list[int], second: list[int]) -> int:
    """How many tokens two prompts start with alike."""
    return next((i for i, (a, b) in enumerate(zip(first, second)) if a != b), min(len(first), len(second)))


def shared_blocks(first: list[int], second: list[int]) -> int:
    """Tokens of the whole blocks two prompts start with alike."""
    return parting(first, second) // BLOCK_TOKENS * BLOCK_TOKENS


@pytest.mark.parametrize("family", FAMILIES)
def test_a_prefix_hit_reuses_exactly_the_cached_tokens_and_gives_the_models_own_logits(states_cache, family):
    harness = Harness(states_cache, family)
    runner, encode = harness.runner, harness.reference.encode
    recurrent = runner.prefix_cache.checkpoints_only
    assert runner.prefix_cache is not None, "the model gets a prefix cache"
    first, second, third = (encode(PREFIX + question) for question in QUESTIONS)
    parted, blocks = parting(first, second), shared_blocks(first, second)
    assert parted == parting(second, third) and parted % BLOCK_TOKENS and blocks >= 10 * BLOCK_TOKENS
    follow_up = first + encode(" The keeper answered at length. And then?")  # the next turn of the first
    long_rest = encode(PREFIX + LONG_QUESTION)
    assert len(long_rest) - parted > STEPWISE_REST and parting(long_rest, second) == parted
    with torch.inference_mode():
        whole = {tuple(ids): harness.loaded.model(input_ids=torch.tensor([ids])).logits[0, -1]
                 for ids in (first, second, third, follow_up, long_rest)}
    reused = {}
    for ids in (first, second, third, follow_up, long_rest):
        reused[tuple(ids)], logits = harness.prefill(ids)
        difference = float((logits.detach() - whole[tuple(ids)]).norm() / whole[tuple(ids)].norm())
        assert difference < 1e-4, (family, reused[tuple(ids)], difference)  # a zeroed state: ~1e-2 to 2e-1
    stepwise = recurrent and not runner.spec.continues_chunks
    expected = [0,
                0 if recurrent else blocks,  # a recurrent model's prompt parts here: it keeps its states there
                parted if recurrent else blocks,  # (a checkpoint's last tokens' keys/values kept with it)
                len(first) if recurrent else len(first) // BLOCK_TOKENS * BLOCK_TOKENS,  # where the first prompt ended
                0 if stepwise else parted if recurrent else blocks]  # a model that continues its state a token at
    # a time takes no long rest
    assert [reused[tuple(ids)] for ids in (first, second, third, follow_up, long_rest)] == expected


@pytest.mark.parametrize("family", FAMILIES)
def test_prompts_after_a_checkpoint_give_what_generate_gives(states_cache, family):
    harness = Harness(states_cache, family)
    encode = harness.reference.encode
    prompts = [encode(PREFIX + question) for question in QUESTIONS]
    first = harness.generate(prompts[0])
    prompts.append(prompts[0] + first.completion_ids + encode(" And then?"))
    finished = [first] + [harness.generate(ids) for ids in prompts[1:]]
    recurrent = harness.runner.spec.has("state")
    assert finished[2].cached_prompt_tokens == (parting if recurrent else shared_blocks)(prompts[1], prompts[2])
    ended = len(prompts[0]) + len(first.completion_ids) - 1  # every token the first row's cache held: its prompt,
    # its answer but the last token drawn (a recurrent model's checkpoint where the row ended, full attention's blocks)
    assert finished[3].cached_prompt_tokens == (ended if recurrent else ended // BLOCK_TOKENS * BLOCK_TOKENS)
    for seq, ids in zip(finished, prompts):
        assert seq.completion_ids == harness.reference.greedy(ids, 6, min_new_tokens=6), family


def test_checkpoints_and_blocks_share_the_budget_and_their_accounting_never_leaks():
    """Random prompts remembered and looked up under a small budget: the bytes counted are the entries' own,
    within the budget; a checkpoint is only ever found with its blocks, and what it gives back is a copy."""
    rng = random.Random(3)
    layers_per_token = 2 * 4 * 8 * 4  # (keys + values) x heads x head size x float32 bytes

    def prompt_cache(ids: list[int]):
        kv = torch.arange(len(ids) * 32, dtype=torch.float32).reshape(1, 4, len(ids), 8)
        state = RowState({0: torch.full((1, 6, 3), float(ids[-1]))}, {0: torch.full((1, 2, 4, 4), float(len(ids)))})
        return cache_from_layers(None, [(kv, kv.clone()), state], len(ids))

    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, LinearAttentionLayer

    class Config:  # a two-layer model: one full-attention layer, one recurrent
        layer_types = ["full_attention", "linear_attention"]

    original = DynamicCache.__init__

    def two_layers(self, *args, config=None, **kwargs):
        original(self)
        self.layers = [DynamicLayer(), LinearAttentionLayer()]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DynamicCache, "__init__", two_layers)
        budget = 40 * BLOCK_TOKENS * layers_per_token
        cache = PrefixCache(Config(), budget, checkpoints=True)
        seen = [[rng.randrange(100) for _ in range(48)] for _ in range(4)]
        for _ in range(300):  # a shared start and a question, or the next turn of an earlier prompt
            ids = rng.choice([p for p in seen if len(p) < 200]) + [rng.randrange(100) for _ in range(rng.randrange(1, 60))]
            seen.append(ids)
            hit = cache.lookup(ids)
            if hit.tokens < hit.shared < len(ids):  # the prompt parts from a cached one: a checkpoint there
                cache.remember(ids, prompt_cache(ids[:hit.shared]), tokens=hit.shared)
            assert hit.tokens - hit.tokens % BLOCK_TOKENS <= hit.shared, hit  # a checkpoint ends inside its run of blocks
            if hit.cache is not None:
                layer = hit.cache.layers[1]
                assert hit.cache.layers[0].keys.shape[-2] == hit.tokens
                assert float(layer.recurrent_states[0].flatten()[0]) == hit.tokens  # the state of that many tokens
                layer.recurrent_states[0].zero_()  # the cached checkpoint is not the caller's to change
            cache.remember(ids, prompt_cache(ids))
            counted = sum(entry.size for entry in (*cache.spans.values(), *cache.checkpoints.values()))
            assert cache.bytes == counted <= budget
            assert sorted(cache.blocks) == sorted(key for span in cache.spans.values() for key in span.keys)
            assert sorted((parent, tail) for parent, tails in cache._at.items() for tail in tails) == sorted(cache.checkpoints)
        assert cache.hit_tokens > 0 and cache.checkpoints
        assert all(float(c.layers[1].recurrent[0].flatten()[0]) > 0 for c in cache.checkpoints.values())
