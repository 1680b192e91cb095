"""Each model's KV cache budget (workers/engine/execution/kv/budget.py): admission by what the rows hold now,
preemption by recompute when decode outgrows it, a context capped to what it holds, and the setting.

One model per kind of cache whose rows grow with every token: full attention, sliding + full, MLA,
linear attention + full, Mamba + full (whose recurrent layers restart on a multi-token forward). With a
budget that holds fewer tokens than the rows will, the rows that outgrow it are preempted (their cache
dropped, prefilled again later: the prompt and every token drawn), every answer still equals
`generate`, and what the model's rows hold never passes the budget.
"""
from __future__ import annotations

import pytest

from .helpers.scheduler_harness import Harness

FAMILIES = ["llama", "gemma3", "deepseek-v3", "qwen3.5", "jamba"]
TOKENS = 48


@pytest.fixture(scope="module")
def budget_cache(tmp_path_factory):
    from workers.tiny.families import build_tiny_families

    cache = tmp_path_factory.mktemp("kv-budget")
    build_tiny_families(FAMILIES, cache_dir=cache)
    return cache


def token_bytes(cache, family: str) -> int:
    return Harness(cache, family, prefix_cache_bytes=0).runner.kv_budget.token_bytes


@pytest.mark.parametrize("family", FAMILIES)
def test_rows_that_outgrow_the_budget_are_preempted_recomputed_and_still_give_what_generate_gives(budget_cache, family):
    from prometheus_client import REGISTRY

    per_token = token_bytes(budget_cache, family)
    words = "one two three four five six seven eight nine ten eleven twelve".split()
    probe = Harness(budget_cache, family, prefix_cache_bytes=0)
    prompts = [probe.reference.encode(" ".join(words[n:n + 6 + n])) for n in range(5)]
    longest = max(len(ids) for ids in prompts) + TOKENS
    budget = per_token * 2 * longest + probe.runner.kv_budget.row_bytes * 5  # two rows at their longest, and a bit
    harness = Harness(budget_cache, family, kv_cache_bytes=budget, prefix_cache_bytes=budget)
    runner = harness.runner
    assert runner.loaded.max_model_len >= longest  # each request alone fits
    held = []

    def check():
        rows_hold = runner.kv_used() - (runner.prefix_cache.bytes if runner.prefix_cache else 0)
        held.append(rows_hold)
        assert runner.kv_used() <= budget, (rows_hold, budget)

    model = harness.model
    before = REGISTRY.get_sample_value("vllm:num_preemptions_total", {"model_name": model}) or 0.0
    finished = harness.run_together(prompts, TOKENS, check)
    preemptions = (REGISTRY.get_sample_value("vllm:num_preemptions_total", {"model_name": model}) or 0.0) - before
    assert preemptions > 0, "no row was preempted"
    assert max(held) > budget // 2  # the budget was used, not held off by admission alone
    for seq, ids in zip(finished, prompts):
        assert seq.finished and not seq.recomputes
        assert seq.completion_ids == harness.reference.greedy(ids, TOKENS, min_new_tokens=TOKENS), family


def test_a_context_longer_than_the_budget_holds_is_capped_and_a_longer_request_is_told_what_fits(budget_cache):
    from workers.engine.errors import JobError

    per_token = token_bytes(budget_cache, "llama")
    harness = Harness(budget_cache, "llama", kv_cache_bytes=per_token * 100)
    assert harness.loaded.max_model_len == 100 and harness.loaded.context_capped_by_kv
    ids = harness.reference.encode("one two three four five six seven eight")
    with pytest.raises(JobError) as raised:
        harness.sequence(ids, 100)
    assert raised.value.status == 400 and "maximum context length is 100 tokens" in str(raised.value)
    assert "KV cache budget" in str(raised.value)


def test_a_budget_too_small_for_any_context_fails_the_load_saying_so(budget_cache):
    from workers.engine.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="KV cache budget of .* holds 10 tokens"):
        Harness(budget_cache, "llama", kv_cache_bytes=token_bytes(budget_cache, "llama") * 10)


def test_the_setting_takes_bytes_with_vllms_suffixes():
    from inference_site.inference_settings import InferenceSettings

    def engine(environ):
        return InferenceSettings.from_environ(environ).engine

    assert engine({"INFERENCE_KV_CACHE_MEMORY": "64MiB"}).kv_cache_bytes == 64 * 1024 * 1024
    assert engine({"INFERENCE_KV_CACHE_MEMORY": "2G"}).kv_cache_bytes == 2 * 1024 ** 3
    assert engine({"INFERENCE_KV_CACHE_MEMORY": "2GB"}).kv_cache_bytes == 2 * 1000 ** 3
    assert engine({"INFERENCE_KV_BUDGET_MB": "3"}).kv_cache_bytes == 3 * 1024 * 1024  # the older setting
    assert engine({}).kv_cache_bytes is None
    with pytest.raises(ValueError, match="INFERENCE_KV_CACHE_MEMORY"):
        engine({"INFERENCE_KV_CACHE_MEMORY": "lots"})


def test_through_the_server_a_request_larger_than_the_budget_is_a_400_saying_what_fits(hf_cache, reference, tmp_path):
    """`serve --kv-cache-memory` (vLLM's flag) holding 100 tokens of the tiny model: a request for more is an
    OpenAI-shaped 400 context_length_exceeded naming the 100 tokens and the budget; a request that fits is
    answered as `generate` answers it; /metrics shows the budget's use and the preemptions counter."""
    import httpx
    import openai

    from .conftest import TINY_MODEL
    from .live_server import LiveServer, base_env, clients

    config = reference.model.config
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * (config.hidden_size // config.num_attention_heads) * 4
    server = LiveServer(base_env(hf_cache, tmp_path), tmp_path, extra_args=("--kv-cache-memory", str(100 * per_token)))
    try:
        client, _ = clients(server)
        ids = reference.encode("The lighthouse keeper wrote in his log")
        with pytest.raises(openai.BadRequestError) as raised:
            client.completions.create(model=TINY_MODEL, prompt=[ids], max_tokens=100, temperature=0)
        error = raised.value.body
        assert raised.value.status_code == 400 and error["code"] == "context_length_exceeded", error
        assert "maximum context length is 100 tokens" in error["message"] and "KV cache budget" in error["message"]
        fits = client.completions.create(model=TINY_MODEL, prompt=[ids], max_tokens=20, temperature=0,
                                         extra_body={"ignore_eos": True, "return_token_ids": True})
        assert fits.choices[0].model_extra["token_ids"] == reference.greedy(ids, 20, min_new_tokens=20)
        metrics = httpx.get(f"{server.base_url}/metrics", timeout=30).text
        assert f'vllm:kv_cache_usage_perc{{model_name="{TINY_MODEL}"}}' in metrics
        assert f'vllm:num_preemptions_total{{model_name="{TINY_MODEL}"}} 0.0' in metrics
    finally:
        server.stop()
