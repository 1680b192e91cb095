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
import torch

from .helpers.scheduler_harness import Harness

FAMILIES = ["llama", "gemma3", "deepseek-v3", "qwen3.5", "jamba"]
TOKENS = 48
WIDE_WINDOW = 128  # a sliding window longer than the test's rows grow


@pytest.fixture(scope="module")
def budget_cache(tmp_path_factory):
    from workers.tiny.families import build_tiny_families

    from workers.tiny.families import build_tiny_family

    cache = tmp_path_factory.mktemp("kv-budget")
    build_tiny_families(FAMILIES, cache_dir=cache)
    build_tiny_family("gemma3", "local/tiny-gemma3-wide", cache_dir=cache, overrides={"sliding_window": WIDE_WINDOW})
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


@pytest.mark.parametrize("family", [*FAMILIES, "gemma3-wide"])
def test_the_budget_charges_a_row_what_its_cache_holds_at_its_length(budget_cache, family):
    """Full attention grows with every token, a sliding layer up to its window, a recurrent state not at all:
    what the budget charges a row of n tokens is what the model's cache of n tokens holds."""
    runner = Harness(budget_cache, family, prefix_cache_bytes=0).runner
    budget = runner.kv_budget
    for length in (1, 5, 15, 16, 17, 40, 127, 128, 129, 300):
        assert budget.row_fixed(length) + length * budget.token_bytes == runner.spec.bytes_for(length), length
    assert budget.row_fixed(10**6) == budget.row_bytes  # at its longest, every window full


def test_short_rows_of_a_sliding_window_model_are_not_charged_whole_windows(budget_cache):
    """Gemma 3 with a 128-token window, a budget that holds four rows as long as these grow: the four run
    together (charged a whole window each, one or two would) and give what `generate` gives."""
    probe = Harness(budget_cache, "gemma3-wide", prefix_cache_bytes=0)
    words = "one two three four five six seven eight nine ten".split()
    prompts = [probe.reference.encode(" ".join(words[n:n + 5])) for n in range(4)]
    tokens = 8
    grown = max(len(ids) for ids in prompts) + tokens + 16  # the headroom admission keeps for each row
    per_row = probe.runner.spec.bytes_for(grown)
    budget = 4 * per_row + per_row // 2
    assert budget < 2 * probe.runner.spec.bytes_for(WIDE_WINDOW)  # whole windows: not even two rows would fit
    harness = Harness(budget_cache, "gemma3-wide", kv_cache_bytes=budget, prefix_cache_bytes=0)
    together = []
    finished = harness.run_together(prompts, tokens, lambda: together.append(harness.runner.running))
    assert max(together) == 4
    for seq, ids in zip(finished, prompts):
        assert seq.completion_ids == harness.reference.greedy(ids, tokens, min_new_tokens=tokens)


def test_a_context_longer_than_the_budget_holds_is_capped_and_a_longer_request_is_told_what_fits(budget_cache):
    from workers.engine.errors import JobError

    per_token = token_bytes(budget_cache, "llama")
    harness = Harness(budget_cache, "llama", kv_cache_bytes=per_token * 100)
    assert harness.loaded.max_model_len == 100
    assert harness.loaded.context_capped_by == "the server's --kv-cache-memory"
    ids = harness.reference.encode("one two three four five six seven eight")
    with pytest.raises(JobError) as raised:
        harness.sequence(ids, 100)
    assert raised.value.status == 400 and "maximum context length is 100 tokens" in str(raised.value)
    assert "all its KV cache budget holds: the server's --kv-cache-memory" in str(raised.value)


def test_a_budget_too_small_for_any_context_fails_the_load_saying_so(budget_cache):
    from workers.engine.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="KV cache budget of .* holds 10 tokens"):
        Harness(budget_cache, "llama", kv_cache_bytes=token_bytes(budget_cache, "llama") * 10)


def test_the_models_own_budget_wins_then_the_servers_then_gpu_memory_utilization(budget_cache):
    """vLLM's --gpu-memory-utilization: the share of the device's whole memory the server may use, what is in
    use already counted against it (on a CPU the machine's memory); --kv-cache-memory wins over it, and a
    model's own kv_cache_memory over both."""
    from workers.engine.errors import ModelLoadError
    from workers.engine.execution.kv.budget import KVBudgetSetting, budget_bytes, device_memory

    cpu = torch.device("cpu")
    free, total = device_memory(cpu)
    assert 0 < free <= total
    assert budget_bytes(KVBudgetSetting(model_bytes=5, server_bytes=7, utilization=0.9), cpu) == (
        5, "this model's kv_cache_memory")
    assert budget_bytes(KVBudgetSetting(server_bytes=7, utilization=0.9), cpu) == (7, "the server's --kv-cache-memory")
    whole, source = budget_bytes(KVBudgetSetting(utilization=1.0), cpu)
    assert source == "the server's --gpu-memory-utilization 1"
    assert abs(whole - device_memory(cpu)[0]) < total // 20  # all of it: what is free now
    half, _ = budget_bytes(KVBudgetSetting(utilization=0.5), cpu)
    assert abs((whole - half) - total // 2) < total // 20
    per_token = token_bytes(budget_cache, "llama")
    capped = Harness(budget_cache, "llama", kv_budget=KVBudgetSetting(model_bytes=per_token * 90, server_bytes=10**9))
    assert capped.loaded.max_model_len == 90 and capped.loaded.context_capped_by == "this model's kv_cache_memory"
    with pytest.raises(ModelLoadError, match="KV cache budget of 0 bytes .*--gpu-memory-utilization 1e-09"):
        Harness(budget_cache, "llama", kv_budget=KVBudgetSetting(utilization=1e-9))


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
    assert engine({"INFERENCE_GPU_MEMORY_UTILIZATION": "0.9"}).gpu_memory_utilization == 0.9
    assert engine({}).gpu_memory_utilization is None
    with pytest.raises(ValueError, match="INFERENCE_GPU_MEMORY_UTILIZATION=1.5: a share"):
        engine({"INFERENCE_GPU_MEMORY_UTILIZATION": "1.5"})


def test_a_models_kv_cache_memory_is_checked_when_saved(db):
    from django.core.exceptions import ValidationError

    from catalog.models import CachedModel

    row = CachedModel(repo_id="local/sized", kv_cache_memory=" 512MiB ")
    row.full_clean()
    assert row.kv_cache_memory == "512MiB"
    for bad in ("lots", "0", "-5G"):
        row.kv_cache_memory = bad
        with pytest.raises(ValidationError, match="kv_cache_memory"):
            row.full_clean()


def test_through_the_server_a_request_larger_than_the_budget_is_a_400_saying_what_fits(hf_cache, reference, tmp_path):
    """`serve --kv-cache-memory` (vLLM's flag) holding 100 tokens of the tiny model, and the config file's
    `kv_cache_memory` for the model itself holding 120, which wins: a request for more is an OpenAI-shaped 400
    context_length_exceeded naming the 120 tokens and the model's setting; /v1/models says the 120 once the
    model is loaded; a request that fits is answered as `generate` answers it; /metrics shows the budget's use
    and the preemptions counter."""
    import httpx
    import openai

    from .conftest import TINY_MODEL
    from .live_server import LiveServer, base_env, clients

    config = reference.model.config
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * (config.hidden_size // config.num_attention_heads) * 4
    (tmp_path / "server.yaml").write_text(f"models:\n  - name: {TINY_MODEL}\n    kv-cache-memory: {120 * per_token}\n")
    server = LiveServer(base_env(hf_cache, tmp_path), tmp_path, extra_args=(
        "--kv-cache-memory", str(100 * per_token), "--config", str(tmp_path / "server.yaml")))
    try:
        client, _ = clients(server)
        ids = reference.encode("The lighthouse keeper wrote in his log")
        with pytest.raises(openai.BadRequestError) as raised:
            client.completions.create(model=TINY_MODEL, prompt=[ids], max_tokens=120, temperature=0)
        error = raised.value.body
        assert raised.value.status_code == 400 and error["code"] == "context_length_exceeded", error
        assert "maximum context length is 120 tokens (all its KV cache budget holds: this model's kv_cache_memory)" \
            in error["message"], error
        assert client.models.retrieve(TINY_MODEL).model_extra["max_model_len"] == 120  # loaded: what it serves
        fits = client.completions.create(model=TINY_MODEL, prompt=[ids], max_tokens=20, temperature=0,
                                         extra_body={"ignore_eos": True, "return_token_ids": True})
        assert fits.choices[0].model_extra["token_ids"] == reference.greedy(ids, 20, min_new_tokens=20)
        metrics = httpx.get(f"{server.base_url}/metrics", timeout=30).text
        assert f'vllm:kv_cache_usage_perc{{model_name="{TINY_MODEL}"}}' in metrics
        assert f'vllm:num_preemptions_total{{model_name="{TINY_MODEL}"}} 0.0' in metrics
    finally:
        server.stop()
