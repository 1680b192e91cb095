"""The step contract and the persistent batch, at the runner, for every kind of cache (no engine thread).

A decode plan executed gives exactly the output it names: one token per row of the plan, in its order,
each the token `model.generate` writes there. Rows join, leave, pause and resume at random steps; after
every change the persistent batch (the runner's view, the slab's positions kept by step, the drawn tokens
reused as the next input) equals one rebuilt from the sequences, and every row's tokens equal `generate`.
"""
from __future__ import annotations

import random
import uuid

import pytest

import protocol
from workers.engine.config import TemplateSettings
from workers.engine.execution.input_batch import InputBatch
from workers.engine.execution.runner import ModelRunner, RunnerSettings, sample_batch
from workers.engine.inputs.generation_job import GenerationJob
from workers.engine.models.model_loader import load_model
from workers.engine.plan import DecodePlan
from workers.engine.sequences import Handover
from workers.engine.step_clock import StepClock
from workers.tiny.families import build_tiny_families

from .conftest import Reference

# Full attention, MLA, every layer sliding, sliding beside full, linear attention beside full, Mamba.
FAMILIES = ["llama", "deepseek-v3", "mistral", "gemma3", "qwen3.5", "mamba"]
PROMPTS = ["Hi", "Once upon a time there was a lighthouse keeper", "1, 2, 3,", "def add(a, b):",
           "The capital of France is a city where the river bends twice", "A", "Tell me a story about a cat"]


@pytest.fixture(scope="module")
def families_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("contract-families")
    build_tiny_families(FAMILIES, cache_dir=cache)
    return cache


def load(cache, model: str):
    from huggingface_hub import constants

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(constants, "HF_HUB_CACHE", str(cache))
        return load_model(protocol.ModelRef.parse(model), device="cpu", dtype="float32")


def new_sequence(loaded, handover: Handover, ids: list[int], max_tokens: int, **params):
    job = protocol.submit_message(f"cmpl-{uuid.uuid4().hex}", "reply", protocol.ModelRef.parse(loaded.model_id),
                                  [ids], protocol.JobParams(temperature=0, ignore_eos=True, max_tokens=max_tokens,
                                                            **params))
    return GenerationJob(job, loaded, TemplateSettings(), handover).sequences[0]


def start(runner: ModelRunner, seq) -> None:
    """Prefill alone, take the first token, join the batch."""
    _, logits = runner.prefill(seq, len(seq.prompt_ids))
    sample_batch(InputBatch([seq]), logits[None]).apply()
    runner.join([seq])


def assert_persistent_batch_is_rebuilt(runner: ModelRunner) -> None:
    view, fresh = runner.view(), InputBatch(runner.rows)
    assert view.rows == fresh.rows
    assert sorted(view.teams) == sorted(fresh.teams)
    for name in ("one_by_one", "rows", "greedy", "sampled", "logprob_rows", "eos_always", "eos_until"):
        assert getattr(view.sampling, name) == getattr(fresh.sampling, name), name
    slab = runner.batch
    if slab.rows and runner.spec.takes_positions:
        inputs = slab.decode_inputs(runner._last_tokens(view))
        assert inputs["position_ids"][:, 0].tolist() == slab.lengths
        assert inputs["input_ids"][:, 0].tolist() == [seq.completion_ids[-1] for seq in runner.batch_rows]
        slab.mask[:slab.rows, slab.end] = False  # decode_inputs marks the next column: undone, nothing ran
    assert slab.padded == (bool(slab.lengths) and min(slab.lengths) < slab.length)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_plan_executed_gives_the_tokens_it_names_through_random_churn(families_cache, family):
    model = f"local/tiny-{family}"
    loaded = load(families_cache, model)
    reference = Reference(families_cache, model)
    runner = ModelRunner(loaded, RunnerSettings(prefill_chunk=512, max_rows=8))
    handover = Handover()
    rng = random.Random(family)
    waiting = [(prompt, rng.randrange(4, 14)) for prompt in PROMPTS]
    every, paused, expected = [], [], {}
    for step in range(40):
        if waiting and (not runner.running or rng.random() < 0.35):  # a row joins
            prompt, tokens = waiting.pop(0)
            ids = reference.encode(prompt)
            seq = new_sequence(loaded, handover, ids, tokens)
            expected[id(seq)] = reference.greedy(ids, tokens, min_new_tokens=tokens)
            start(runner, seq)
            every.append(seq)
        if paused and rng.random() < 0.5:  # a paused row resumes where it stopped
            runner.join([paused.pop(0)])
        elif runner.running > 1 and rng.random() < 0.2:  # a row pauses, keeping its keys/values
            seq = rng.choice(runner.rows)
            runner.pause([seq])
            paused.append(seq)
        runner.drop_finished()  # rows that ended leave
        assert_persistent_batch_is_rebuilt(runner)
        if not runner.running:
            if not waiting and not paused:
                break
            continue
        plan = DecodePlan(runner.view(), StepClock())
        before = [list(seq.completion_ids) for seq in plan.rows.rows]
        output = runner.execute(plan)
        assert output.rows is plan.rows and len(output.token_ids) == len(plan.rows)
        for seq, history, token in zip(plan.rows.rows, before, output.token_ids):
            assert token == expected[id(seq)][len(history)], (family, step, seq.index)
        output.apply()
        assert [seq.completion_ids[-1] for seq in plan.rows.rows] == output.token_ids
    assert not waiting and not paused and not runner.running
    for seq in every:
        assert seq.finish_reason == "length"
        assert seq.completion_ids == expected[id(seq)]


def test_a_plan_for_rows_the_runner_does_not_hold_is_refused(families_cache):
    loaded = load(families_cache, "local/tiny-llama")
    runner = ModelRunner(loaded, RunnerSettings(max_rows=4))
    seq = new_sequence(loaded, Handover(), [1, 2, 3], 4)
    start(runner, seq)
    with pytest.raises(ValueError):
        runner.execute(DecodePlan(InputBatch(runner.rows)))
    assert runner.execute(DecodePlan(runner.view())).token_ids[0] is not None


def test_the_hand_over_carries_each_token_and_end_in_order(families_cache):
    """What the output thread is given: every token of a row, then its end, in the order they were decided."""
    loaded = load(families_cache, "local/tiny-llama")
    runner = ModelRunner(loaded, RunnerSettings(max_rows=4))
    handover = Handover()
    seq = new_sequence(loaded, handover, [1, 2, 3], 3)
    start(runner, seq)
    while runner.running:
        runner.execute(DecodePlan(runner.view())).apply()
        runner.drop_finished()
    entries = handover.take()
    assert [entry[1] for entry in entries] == [*seq.completion_ids, None]
    assert [entry[4] for entry in entries] == [None, None, None, "length"]
    assert handover.take() == []


def test_a_stop_string_found_off_the_step_is_never_shown_nor_billed(families_cache):
    """The output thread finds a stop string after the engine may have decoded past it: what the client gets
    (text, token ids, usage) ends where the stop string starts, exactly as if it had been found in the step."""
    from workers.engine.config import EngineConfig

    from .conftest import engine_running
    from .outbox import Outbox

    model = "local/tiny-llama"
    reference = Reference(families_cache, model)
    prompt = reference.encode("Once upon a time there was")
    whole = reference.greedy(prompt, 24, min_new_tokens=24)
    cut = next(n for n in range(6, 20) if reference.decode(whole[:n]) != reference.decode(whole[:n - 1]))
    stop = reference.decode(whole[:cut])[len(reference.decode(whole[:cut - 1])):]  # the text the cut-th token adds
    full = reference.decode(whole)
    outbox = Outbox()
    with engine_running(families_cache, outbox.emit, EngineConfig(max_num_seqs=4)) as engine:
        reply = f"reply.{uuid.uuid4().hex}"
        engine.submit(protocol.submit_message(
            f"cmpl-{uuid.uuid4().hex}", reply, protocol.ModelRef.parse(model), [prompt],
            protocol.JobParams(temperature=0, ignore_eos=True, max_tokens=24, stop=[stop])))
        outbox.wait([reply])
    done = outbox.messages[reply][-1]
    assert done["type"] == protocol.DONE
    text = "".join(choice["text"] for message in outbox.messages[reply] for choice in message.get("choices", []))
    assert text == full[:full.index(stop)]
    ids = outbox.choices(reply)[0]["ids"]  # up to the token that completed the stop string, none after
    assert ids == whole[:len(ids)]
    assert stop in reference.decode(ids) and stop not in reference.decode(ids[:-1])
    assert done["usage"]["completion_tokens"] == len(ids)
