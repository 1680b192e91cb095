"""Speculative decoding's proposers and settings: n-gram lookup, the adaptive back-off and width, a draft model
(same tokenizer, or refused), sampled rows' distribution under verification (a two-sample test), vLLM's JSON
and the catalog's per-model value. The verification path itself: tests/test_speculative.py."""
from __future__ import annotations

import uuid

import numpy
import torch
import pytest

import protocol
from protocol.speculative import SpeculativeConfig, parse_speculative_config
from workers.engine.config import TemplateSettings
from workers.engine.execution.runner import ModelRunner, RunnerSettings
from workers.engine.inputs.generation_job import GenerationJob
from workers.engine.sequences import Handover
from workers.engine.speculation.ngram import lookup
from workers.engine.speculation.rows import NgramProposer, RowSpeculation

from .conftest import Reference
from .test_speculative import CONFIG, PROMPTS, Oracle, run, spec_cache  # noqa: F401 (a fixture)
from .test_step_contract import load, new_sequence

def test_lookup_finds_the_longest_latest_match():
    tokens = numpy.array([1, 2, 3, 9, 9, 2, 3, 7, 8, 5, 1, 2, 3])
    assert lookup(tokens, 2, 4, 3) == [9, 9, 2]  # [1, 2, 3] matched at the start, longer than [2, 3] later
    assert lookup(numpy.array([5, 2, 3, 7, 2, 3]), 2, 4, 2) == [7, 2]
    assert lookup(numpy.array([1, 2, 3, 4]), 2, 4, 3) == []
    assert lookup(numpy.array([4, 1, 4]), 1, 3, 2) == [1, 4]


def test_adaptive_back_off_stops_proposing_after_rejections():
    state = RowSpeculation([1, 2, 3])
    for _ in range(3):
        state.verified(4, 0)
    assert state.quiet > 0


def test_the_config_is_vllms_json():
    assert parse_speculative_config("") is None
    config = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4,'
                                      ' "prompt_lookup_min": 2}')
    assert (config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max) == (5, 2, 4)
    for bad in ('{"method": "eagle", "num_speculative_tokens": 3}', '{"method": "ngram"}', "[1]", "{",
                '{"num_speculative_tokens": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 3}',
                '{"num_speculative_tokens": 2, "colour": 1}'):
        with pytest.raises(ValueError):
            parse_speculative_config(bad)


def chi_square_same(first: list, second: list) -> tuple[float, float]:
    """Two samples' homogeneity statistic (categories with fewer than 10 in both pooled into one) and its
    99.9 % critical value (Wilson-Hilferty)."""
    from collections import Counter

    a, b = Counter(first), Counter(second)
    common = [key for key in set(a) | set(b) if a[key] + b[key] >= 10]
    rows = [(a[key], b[key]) for key in common]
    rest = (len(first) - sum(x for x, _ in rows), len(second) - sum(y for _, y in rows))
    if sum(rest):
        rows.append(rest)
    n_a, n_b = len(first), len(second)
    statistic = sum((x * n_b - y * n_a) ** 2 / (n_a * n_b * (x + y)) for x, y in rows)
    df = max(1, len(rows) - 1)
    return statistic, df * (1 - 2 / (9 * df) + 3.09 * (2 / (9 * df)) ** 0.5) ** 3


def sampled_sequence(loaded, ids: list[int], max_tokens: int, **params):
    job = protocol.submit_message(f"cmpl-{uuid.uuid4().hex}", "reply", protocol.ModelRef.parse(loaded.model_id),
                                  [ids], protocol.JobParams(ignore_eos=True, max_tokens=max_tokens, **params))
    return GenerationJob(job, loaded, TemplateSettings(), Handover()).sequences[0]


def assert_sampling_unchanged(loaded, make_batch, greedy: list[int], batches: int = 30, check=None) -> None:
    """Sample `batches` batches of rows (`make_batch(batch)`) without speculation, then with drafts that are the
    prompt's greedy continuation whatever a row drew (any proposal must do): drafts were kept often enough to
    mean something, every row passes `check`, and the first three tokens' joint distribution (and its parts)
    is the same both ways (chi-square)."""
    samples, kept = {}, 0
    for speculate in (False, True):
        runner = ModelRunner(loaded, RunnerSettings(max_rows=32, speculative=CONFIG if speculate else None))
        found = []
        for batch in range(batches):
            sequences = make_batch(batch)
            if speculate:
                runner.proposer = Oracle({id(seq): greedy for seq in sequences}, lambda seq, done: None, count=3)
            run(runner, sequences)
            for seq in sequences:
                if check is not None:
                    check(seq)
                found.append(tuple(seq.completion_ids))
            if speculate:
                kept += runner.proposer.take_counts()[2]
        samples[speculate] = found
    assert kept > 100
    for part in (slice(0, 1), slice(1, 2), slice(0, 2), slice(0, 3)):
        statistic, critical = chi_square_same([s[part] for s in samples[False]], [s[part] for s in samples[True]])
        assert statistic < critical, (part, statistic, critical)


def test_sampled_rows_keep_their_distribution(spec_cache):
    """Sampled rows verify drafts by drawing at every position (rejection sampling for one-token drafts): the
    first three tokens' joint distribution over many seeds equals plain sampling's, while drafts are kept."""
    model = "local/tiny-llama"
    loaded, reference = load(spec_cache, model), Reference(spec_cache, model)
    ids = reference.encode(PROMPTS[1])
    assert_sampling_unchanged(loaded, lambda batch: [
        sampled_sequence(loaded, ids, 3, temperature=0.8, top_k=3, seed=1000 * batch + n) for n in range(32)],
        reference.greedy(ids, 4, min_new_tokens=4))


def test_a_model_may_set_its_own_speculative_config_over_the_servers():
    """The catalog's per-model value (vLLM's JSON, "off", or "" for the server's) as the runner gets it."""
    from workers.engine.core.model_manager import ModelManager

    manager = ModelManager("cpu", "float32", 300.0, None, runner_settings=RunnerSettings(speculative=CONFIG))
    manager.configure({"local/a": {"speculative_config": "off"}, "local/b": {"speculative_config": ""},
                       "local/c": {"speculative_config": '{"method": "ngram", "num_speculative_tokens": 8}'},
                       "local/d": {"speculative_config": '{"method": "eagle"}'}})
    assert manager.runner_settings_for("local/a").speculative is None
    assert manager.runner_settings_for("local/b").speculative == CONFIG
    assert manager.runner_settings_for("local/c").speculative.num_speculative_tokens == 8
    assert manager.runner_settings_for("local/d").speculative == CONFIG  # refused at save; here the server's
    assert manager.runner_settings_for("local/unknown").speculative == CONFIG


def test_the_catalog_refuses_a_bad_speculative_config():
    from django.core.exceptions import ValidationError

    from catalog.models import CachedModel

    for good in ("", "off", '{"method": "ngram", "num_speculative_tokens": 3}'):
        CachedModel(repo_id="local/x", speculative_config=good).clean()
    with pytest.raises(ValidationError, match="speculative_config"):
        CachedModel(repo_id="local/x", speculative_config='{"method": "draft_model", "num_speculative_tokens": 3}').clean()
    with pytest.raises(ValidationError, match="speculative_config"):
        CachedModel(repo_id="local/x", speculative_config='{"method": "eagle", "num_speculative_tokens": 3}').clean()


@pytest.mark.parametrize("draft_family", ["llama", "qwen3"])
def test_a_draft_model_proposes_and_output_stays_generates(spec_cache, draft_family):
    """A draft model from the catalog with the target's tokenizer (the target itself: the ceiling, every draft
    kept; a random model of another family: the floor): greedy output is generate's, batched."""
    model = "local/tiny-llama"
    loaded, reference = load(spec_cache, model), Reference(spec_cache, model)
    draft_name = f"local/tiny-{draft_family}"
    loaded.draft = loaded if draft_name == model else load(spec_cache, draft_name)
    try:
        config = SpeculativeConfig("draft_model", 4, model=draft_name)
        runner = ModelRunner(loaded, RunnerSettings(max_rows=8, speculative=config))
        assert type(runner.proposer).__name__ == "DraftProposer"
        handover, sequences, expected = Handover(), [], {}
        for n, prompt in enumerate(PROMPTS[:3]):
            ids = reference.encode(prompt)
            seq = new_sequence(loaded, handover, ids, 9 + 4 * n)
            expected[id(seq)] = reference.greedy(ids, seq.max_tokens, min_new_tokens=seq.max_tokens)
            sequences.append(seq)
        run(runner, sequences)
        for seq in sequences:
            assert seq.completion_ids == expected[id(seq)]
        drafts, drafted, accepted = runner.proposer.take_counts()
        assert drafts > 0
        if draft_name == model:
            assert accepted >= drafted * 0.9  # the target drafting for itself: (nearly) every guess kept
    finally:
        loaded.draft = None


def test_a_draft_model_with_another_tokenizer_is_refused(spec_cache):
    import copy
    import dataclasses

    from workers.engine.errors import ModelLoadError
    from workers.engine.speculation.draft import check_same_tokenizer

    loaded = load(spec_cache, "local/tiny-llama")
    check_same_tokenizer(loaded, load(spec_cache, "local/tiny-qwen3"))  # the families share one tokenizer...
    with pytest.raises(ModelLoadError, match="tiny-qwen2 has another tokenizer than local/tiny-llama"):
        check_same_tokenizer(loaded, load(spec_cache, "local/tiny-qwen2"))  # ... but Qwen2's adds a token
    other = copy.deepcopy(loaded.tokenizer)
    other.add_tokens(["<only-in-the-draft>"])
    with pytest.raises(ModelLoadError, match="has another tokenizer than local/tiny-llama"):
        check_same_tokenizer(loaded, dataclasses.replace(loaded, tokenizer=other, model_id="local/other"))
    with pytest.raises(ModelLoadError, match="must cache full attention"):
        check_same_tokenizer(loaded, load(spec_cache, "local/tiny-mistral"))


def test_a_draft_model_loads_beside_its_target_or_the_load_fails_clearly(spec_cache):
    from huggingface_hub import constants

    from workers.engine.core.model_manager import LoadPlan
    from workers.engine.errors import ModelLoadError

    ref = protocol.ModelRef.parse("local/tiny-llama")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(constants, "HF_HUB_CACHE", str(spec_cache))
        plan = LoadPlan(ref, "cpu", "float32", "test",
                        speculative=SpeculativeConfig("draft_model", 3, model="local/tiny-qwen3"))
        loaded = plan.load()
        assert loaded.draft.model_id == "local/tiny-qwen3"
        alone = LoadPlan(ref, "cpu", "float32", "test").load()
        assert loaded.memory_bytes == alone.memory_bytes + loaded.draft.memory_bytes > alone.memory_bytes
        other = LoadPlan(ref, "cpu", "float32", "test",
                         speculative=SpeculativeConfig("draft_model", 3, model="local/tiny-qwen2"))
        with pytest.raises(ModelLoadError, match="has another tokenizer"):
            other.load()
        missing = LoadPlan(ref, "cpu", "float32", "test",
                           speculative=SpeculativeConfig("draft_model", 3, model="local/no-such-draft"))
        with pytest.raises(ModelLoadError, match="the draft model local/no-such-draft for local/tiny-llama"):
            missing.load()


def test_the_width_pays_for_the_rows_that_compute_it():
    """One row with good drafts verifies them all; 16 rows of which half propose verify none on CPU, a few that all
    propose do; rows whose drafts often fail verify fewer columns (the guessed cost curves: before a model's is
    measured)."""
    from types import SimpleNamespace

    proposer = NgramProposer(CONFIG, "cpu")
    rows = [SimpleNamespace(speculation=RowSpeculation([1, 2])) for _ in range(16)]
    assert proposer.width({0: 4}, rows[:1]) == 4
    assert proposer.width({i: 4 for i in range(0, 16, 2)}, rows) == 0
    assert proposer.width({i: 4 for i in range(4)}, rows[:4]) > 0  # a few rows that all propose
    for _ in range(2):
        rows[0].speculation.verified(4, 1)
    assert 0 < proposer.width({0: 4}, rows[:1]) < 4
    assert NgramProposer(CONFIG, "cuda").width({0: 4, 1: 4}, rows[:2]) == 4


def test_the_width_follows_the_measured_cost_of_positions():
    """The same drafts on three devices: where positions are free every draft is verified, even with rows that
    propose nothing beside; where each costs its full share none is; where wider forwards get cheaper per
    position (CPU kernels) one row's width goes wide, while 16 rows of which half propose verify nothing (the
    rows that propose nothing would wait longer than SPARED_SLOWDOWN), nor one row while prompts wait."""
    from types import SimpleNamespace

    from workers.engine.speculation.step_cost import StepCost

    config = SpeculativeConfig("ngram", 32, 2, 4)
    rows = [SimpleNamespace(speculation=RowSpeculation([1, 2])) for _ in range(16)]
    flat = StepCost({1: 1.0, 4096: 1.0}, measured=True)
    share = StepCost({1: 1.0, 2: 2.0}, measured=True)
    steps = StepCost({1: 34.0, 8: 66.0, 16: 67.0, 24: 73.0, 32: 84.0, 64: 110.0}, measured=True)  # SmolLM2, 2 cores
    assert NgramProposer(config, cost=flat).width({i: 32 for i in range(0, 16, 2)}, rows) == 32
    assert NgramProposer(config, cost=share).width({0: 32}, rows[:1]) == 0
    assert 15 <= NgramProposer(config, cost=steps).width({0: 32}, rows[:1]) <= 23  # up to 24 positions, not on
    assert NgramProposer(config, cost=steps).width({0: 4}, rows[:1]) == 4
    assert NgramProposer(config, cost=steps).width({i: 32 for i in range(0, 16, 2)}, rows) == 0
    assert NgramProposer(config, cost=steps).width({i: 32 for i in range(16)}, rows) > 0
    # sequences waiting for their prefill wait for the step too: one row's drafts may not delay them on CPU
    assert NgramProposer(config, cost=steps).width({0: 32}, rows[:1], waiting=True) == 0
    assert NgramProposer(config, cost=flat).width({0: 32}, rows[:1], waiting=True) == 32


def test_a_step_cost_is_interpolated_and_measured_on_the_model(spec_cache):
    from workers.engine.speculation.step_cost import StepCost, measure_step_cost

    cost = StepCost({1: 1.0, 16: 2.5, 32: 3.0}, measured=True)
    assert cost(1) == 1.0 and cost(8) == pytest.approx(1.7) and cost(64) == pytest.approx(4.0)
    assert cost(0) == 1.0
    loaded = load(spec_cache, "local/tiny-llama")
    measured = measure_step_cost(loaded.model, loaded.device, 40)
    assert measured.measured and measured.positions[0] == 1 and measured.positions[-1] <= 40
    assert all(seconds > 0 for seconds in measured.times)
    assert "1 positions" in measured.describe()
    assert measure_step_cost(loaded.model, loaded.device, 5000).positions[-1] <= 1024  # past it: extrapolated


class NarrowModel(torch.nn.Module):
    """A model whose forward fails past 8 positions (as a large one runs out of memory on a wide forward)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, **kwargs):
        if input_ids.shape[1] > 8:
            raise torch.OutOfMemoryError("a forward this wide does not fit")
        return self.model(input_ids=input_ids, **kwargs)


def test_a_forward_that_fails_wide_keeps_the_narrower_points(spec_cache):
    from workers.engine.speculation.step_cost import measure_step_cost

    loaded = load(spec_cache, "local/tiny-llama")
    measured = measure_step_cost(NarrowModel(loaded.model), loaded.device, 40)
    assert measured.measured and measured.positions == [1, 2, 4, 8]
    assert measured(40) > 0
