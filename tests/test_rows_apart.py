"""A row far longer than the others decodes apart from the slab (workers/engine/execution/kv/apart.py), so the short
rows beside it hold their own lengths, not its: a long prompt joining short rows, and short prompts joining a long
row (which leaves the slab with a copy of its cache). Every row's tokens stay the ones `generate` writes, on every
kind of cache; the budget's projection counts the rows where they are; a model of sliding layers only (a row holds
at most its window) keeps every row in the slab; and through `serve`, its setting from the environment."""
from __future__ import annotations

import pytest

from workers.engine.execution.kv.apart import MOST_APART, rows_apart
from workers.engine.execution.kv.specs import SLIDING

from .test_step_contract import load, new_sequence

CACHE_KINDS = ["llama", "mistral", "gemma3", "qwen3.5", "deepseek-v3", "jamba"]
TOKENS = 16


def test_only_a_row_whose_absence_saves_most_of_the_slab_goes_apart():
    assert rows_apart([3564] + [164] * 31, 0, 1) == [0]  # 31 x 3,564 columns saved
    assert rows_apart([164] * 31 + [3564], 0, 1) == [31]
    assert rows_apart([144] * 64, 0, 1) == []  # alike
    assert rows_apart([400, 380, 300, 100], 0, 1) == []  # spread, no outlier: the slab holds < twice
    assert rows_apart([3564, 164], 0, 1) == []  # two rows: apart would only add a forward
    assert rows_apart([3564, 164, 164], 0, 1) == [0]
    assert rows_apart([3564] + [164] * 31, 0, 200_000) == []  # saves less than asked
    assert rows_apart([4000, 3000] + [100] * 30, 0, 1) == [0, 1]
    assert MOST_APART == 2 and rows_apart([4000, 3000, 2000] + [100] * 30, 0, 1) == []  # a third stays: < twice
    assert rows_apart([4000, 3000] + [100] * 30, MOST_APART - 1, 1) == []  # rows apart already count
    assert rows_apart([4000] + [100] * 30, MOST_APART - 1, 1) == [0]
    assert rows_apart([4000] + [100] * 30, MOST_APART, 1) == []


def test_what_a_row_must_save_to_go_apart_on_each_device():
    import torch

    from workers.engine.execution.kv.apart import APART_LEAST_CPU_BYTES, least_saved_tokens
    from workers.engine.execution.kv.budget import KVBudget

    budget = KVBudget(bytes=40 * 2**30, token_bytes=128 * 1024, row_bytes=0)
    assert least_saved_tokens(None, torch.device("cpu"), budget) == APART_LEAST_CPU_BYTES // (128 * 1024)
    assert least_saved_tokens(None, torch.device("cuda"), budget) == 10 * 2**30 // (128 * 1024)  # a quarter
    assert least_saved_tokens(1, torch.device("cuda"), budget) == 1  # a setting wins
    assert least_saved_tokens(None, torch.device("cpu"), KVBudget(bytes=2**30, token_bytes=0, row_bytes=4096)) is None
    assert least_saved_tokens(-1, torch.device("cpu"), budget) is None  # INFERENCE_ROWS_APART_MB=off


def test_the_setting_reaches_each_models_runner(kinds_cache):
    from inference_site.inference_settings import InferenceSettings
    from workers.engine.core.engine import Engine
    from workers.engine.execution.runner import ModelRunner

    for value, expected in (("off", None), ("1", 1 * 2**20 // 512), ("auto", 64 * 2**20 // 512)):
        config = InferenceSettings.from_environ({"INFERENCE_ROWS_APART_MB": value}).engine
        engine = Engine(lambda channel, message: None, config)
        runner = ModelRunner(load(kinds_cache, "local/tiny-llama"), engine.manager.runner_settings)
        assert runner.kv_budget.token_bytes == 512 and runner.apart_least_tokens == expected, value


@pytest.fixture(scope="module")
def kinds_cache(tmp_path_factory):
    from workers.tiny.families import build_tiny_families

    cache = tmp_path_factory.mktemp("apart-families")
    build_tiny_families(CACHE_KINDS, cache_dir=cache)
    return cache


def _setup(cache, family: str):
    from workers.engine.config import EngineConfig
    from workers.engine.core.metrics import EngineMetrics
    from workers.engine.core.scheduler import Scheduler
    from workers.engine.execution.runner import ModelRunner, RunnerSettings

    from .conftest import Reference

    model = f"local/tiny-{family}"
    loaded = load(cache, model)
    runner = ModelRunner(loaded, RunnerSettings(prefill_chunk=64, max_rows=8, rows_apart_least_bytes=1,
                                                prefix_cache_bytes=64 * 2**20))
    scheduler = Scheduler({model: runner}, EngineMetrics(), EngineConfig(max_num_seqs=8, prefill_chunk=64,
                                                                         device="cpu"))
    return model, loaded, runner, scheduler, Reference(cache, model)


def _sequences(model, loaded, prompts):
    from workers.engine.sequences import Handover

    sequences = [new_sequence(loaded, Handover(), ids, TOKENS) for ids in prompts]
    for seq in sequences:
        seq.request.model_name = seq.request.served_name = model  # as the engine names a job's model on admitting it
    return sequences


def _step(scheduler) -> None:
    scheduler.admit()
    scheduler.prefill(scheduler.decoding(), first=True)
    scheduler.decode()
    scheduler.prefill(True)
    for runner in scheduler.runners.values():
        runner.drop_finished()


@pytest.mark.parametrize("long_first", [False, True], ids=["long-joins-short", "short-join-long"])
@pytest.mark.parametrize("family", CACHE_KINDS)
def test_a_long_row_decodes_apart_and_every_row_gives_what_generate_gives(kinds_cache, family, long_first):
    model, loaded, runner, scheduler, reference = _setup(kinds_cache, family)
    words = "one two three four five six seven eight nine ten eleven twelve".split()
    short = [reference.encode(" ".join(words[n:n + 4])) for n in range(4)]
    long = reference.encode(" ".join(words * 12))
    assert len(long) > 8 * max(len(ids) for ids in short)
    first, then = ([long], short) if long_first else (short, [long])
    early, late = _sequences(model, loaded, first), _sequences(model, loaded, then)
    scheduler.enqueue(early)
    for _ in range(2):
        _step(scheduler)
    assert not any(seq.finished for seq in early) and not runner.solo_rows
    scheduler.enqueue(late)
    long_seq = early[0] if long_first else late[0]
    apart_seen, steps = False, 0
    while not all(seq.finished for seq in early + late) and steps < 40:
        _step(scheduler)
        if long_seq in runner.solo_rows and runner.batch_rows:
            apart_seen = True
            assert runner.batch.length < len(long) // 2, "the slab holds the long row's length"
            lengths = [len(seq.prompt_ids) + len(seq.completion_ids) for seq in runner.rows]
            slab_layout = len(lengths) * max(lengths) * runner.kv_budget.token_bytes
            assert runner.kv_projected() < slab_layout / 2, "the projection counts the long row in the slab"
        steps += 1
    # every layer sliding: a row holds at most its window whatever its length, so the slab wastes nothing to spare
    grows = runner.kv_budget.token_bytes > 0
    assert apart_seen == grows, f"apart: {apart_seen} ({runner.spec.describe()})"
    for seq in early + late:
        assert seq.completion_ids == reference.greedy(seq.prompt_ids, TOKENS, min_new_tokens=TOKENS), family
    if not grows or runner.spec.has(SLIDING):
        return
    # a row apart's answer is not kept, its prompt was (at its prefill): the next turn starts from it
    [turn] = _sequences(model, loaded, [long_seq.prompt_ids + long_seq.completion_ids + short[0]])
    scheduler.enqueue([turn])
    while not turn.finished:
        _step(scheduler)
    assert turn.cached_prompt_tokens >= len(long_seq.prompt_ids) - 15, turn.cached_prompt_tokens  # whole blocks
    assert turn.completion_ids == reference.greedy(turn.prompt_ids, TOKENS, min_new_tokens=TOKENS), family


def test_through_the_server_a_long_prompt_beside_short_ones_decodes_apart_and_all_equal_generate(
        hf_cache, reference, tmp_path):
    """`serve` with INFERENCE_ROWS_APART_MB from its environment, the real SDK: every answer is `generate`'s,
    and the log says the long row went apart."""
    import asyncio

    from .live_server import LiveServer, base_env, clients
    from .test_model_families import complete

    server = LiveServer(base_env(hf_cache, tmp_path, INFERENCE_ROWS_APART_MB="0.01"), tmp_path, name="apart")
    try:
        words = "one two three four five six seven eight nine ten eleven twelve".split()
        prompts = [reference.encode(" ".join(words * 20))] + [reference.encode(" ".join(words[n:n + 3]))
                                                              for n in range(6)]
        _, client = clients(server)

        async def run():
            return await asyncio.gather(*[complete(client, "local/tiny-llama", [ids], max_tokens=48)
                                          for ids in prompts])

        answers = asyncio.run(run())
        assert [tokens for [tokens] in answers] == [reference.greedy(ids, 48, min_new_tokens=48) for ids in prompts]
        assert "decode apart from the slab" in server.log()
    finally:
        server.stop()
