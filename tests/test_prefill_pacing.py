"""The prefill budget per engine step: a share of one decode step's time while streams run, everything otherwise."""
from __future__ import annotations

import pytest

from workers.engine.core.prefill_pacing import LEAST_TOKENS, PrefillPacer


def test_with_nothing_to_decode_or_nothing_measured_a_step_takes_the_whole_chunk():
    pacer = PrefillPacer(512)
    assert pacer.budget(decoding=True) == 512  # nothing measured yet
    pacer.decoded(0.040)
    pacer.prefilled(1000, 0.5)
    assert pacer.budget(decoding=False) == 512


def test_while_streams_run_a_step_prefills_what_fits_in_its_share_of_a_decode_step():
    pacer = PrefillPacer(512, decode_share=1.0)
    pacer.decoded(0.100)
    pacer.prefilled(400, 0.200)  # 0.5 ms a token
    assert pacer.budget(decoding=True) == 200
    pacer.decoded(0.100 + 5 * 0.100)  # a slower decode step lets more in, through the moving average
    assert pacer.budget(decoding=True) == 400
    half = PrefillPacer(512)  # the default: half a decode step
    half.decoded(0.100)
    half.prefilled(400, 0.200)
    assert half.budget(decoding=True) == 100
    assert PrefillPacer(512, decode_share=0.5).budget(decoding=False) == 512


def test_the_budget_stays_between_the_floor_and_the_chunk():
    pacer = PrefillPacer(512)
    pacer.decoded(0.001)
    pacer.prefilled(100, 1.0)
    assert pacer.budget(decoding=True) == LEAST_TOKENS
    pacer.decoded(100.0)
    pacer.decoded(100.0)
    assert pacer.budget(decoding=True) == 512
    assert PrefillPacer(8).budget(decoding=True) == 8


def test_the_share_setting_reaches_the_engines_pacer():
    from inference_site.inference_settings import InferenceSettings
    from workers.engine.core.engine import Engine

    config = InferenceSettings.from_environ({"INFERENCE_PREFILL_SHARE": "0.25"}).engine
    assert Engine(lambda channel, message: None, config).scheduler.pacer.share == 0.25


# One model per kind of cache: full attention, sliding window, linear attention + full, MLA, Mamba + full.
CACHE_KINDS = ["llama", "mistral", "qwen3.5", "deepseek-v3", "jamba"]


@pytest.fixture(scope="module")
def kinds_cache(tmp_path_factory):
    from workers.tiny.families import build_tiny_families

    cache = tmp_path_factory.mktemp("pacing-families")
    build_tiny_families(CACHE_KINDS, cache_dir=cache)
    return cache


@pytest.mark.parametrize("family", CACHE_KINDS)
def test_short_prompts_prefill_whole_and_long_ones_in_chunks_within_the_steps_budget(kinds_cache, family):
    """A step's budget that ends inside a short prompt takes that prompt whole where the model prefills prompts
    together (a piece of it would cost a forward of its own now and another for its rest next step); a prompt
    longer than a least forward still goes in chunks (where the cache continues chunks). Every row's tokens are still the ones `generate` writes."""
    import uuid

    from huggingface_hub import constants

    import protocol
    from workers.engine.config import EngineConfig, TemplateSettings
    from workers.engine.core.metrics import EngineMetrics
    from workers.engine.core.scheduler import Scheduler
    from workers.engine.execution.runner import ModelRunner, RunnerSettings
    from workers.engine.inputs.generation_job import GenerationJob
    from workers.engine.models.model_loader import load_model
    from workers.engine.sequences import Handover

    from .conftest import Reference

    model = f"local/tiny-{family}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(constants, "HF_HUB_CACHE", str(kinds_cache))
        loaded = load_model(protocol.ModelRef.parse(model), device="cpu", dtype="float32")
    reference = Reference(kinds_cache, model)
    chunk = 40  # the step's budget; a least forward is min(LEAST_TOKENS, chunk) = 40 tokens
    config = EngineConfig(max_num_seqs=8, prefill_chunk=chunk, device="cpu")
    runner = ModelRunner(loaded, RunnerSettings(prefill_chunk=chunk, max_rows=8))
    scheduler = Scheduler({model: runner}, EngineMetrics(), config)
    handover, tokens = Handover(), 4
    words = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen".split()
    prompts = [reference.encode(" ".join(words[n:n + 12])) for n in range(4)]
    prompts.append(reference.encode(" ".join(words * 4)))  # longer than a least forward: prefilled in chunks
    assert all(len(ids) < chunk for ids in prompts[:4]) and sum(len(ids) for ids in prompts[:3]) > chunk
    assert len(prompts[-1]) > chunk
    sequences = []
    for ids in prompts:
        job = protocol.submit_message(f"cmpl-{uuid.uuid4().hex}", "reply", protocol.ModelRef.parse(model), [ids],
                                      protocol.JobParams(temperature=0, ignore_eos=True, max_tokens=tokens))
        request = GenerationJob(job, loaded, TemplateSettings(), handover)
        request.model_name = request.served_name = model  # as the engine names a job's model on admitting it
        sequences.append(request.sequences[0])
    together = all(runner.prefills_together(seq) for seq in sequences[:4])
    scheduler.enqueue(sequences)
    chunks_seen, split, steps = set(), False, 0
    while not all(seq.finished for seq in sequences) and steps < 40:
        scheduler.admit()
        scheduler.prefill(scheduler.decoding(), first=True)
        scheduler.decode()
        scheduler.prefill(True)
        split |= any(0 < seq.prefilled < len(seq.prompt_ids) for seq in sequences[:4])
        if 0 < sequences[-1].prefilled < len(prompts[-1]):
            chunks_seen.add(sequences[-1].prefilled)
        steps += 1
    assert not (together and split), "a short prompt was split"
    if runner.spec.continues_chunks:  # recurrent layers that restart on a chunk take a prompt whole, as before
        assert chunks_seen, "the long prompt was prefilled whole in one step"
    for seq, ids in zip(sequences, prompts):
        assert seq.completion_ids == reference.greedy(ids, tokens, min_new_tokens=tokens), (family, seq.completion_ids)
