"""Speculative decoding for rows with penalties, a logit bias or a grammar: at draft position j the penalties
see the history with d1..dj and the grammar's mask is the one after d1..dj; a draft the grammar refuses ends
the row's run; the matcher stands after what was kept. Greedy output is exactly what one-token steps write
(and `model.generate`'s where it has the same penalty), sampled rows keep their distribution.

Random-weight models rarely repeat their prompt, so drafts come mostly from an oracle (the one-token steps'
own output: right, or corrupted at chosen places, or a token the grammar refuses); the real n-gram proposer
runs too. Logit biases towards a few tokens that the penalties then push down make which of them comes next
hang on every token before it, so a penalty that missed a draft would show.
"""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

from protocol.speculative import SpeculativeConfig
from workers.engine.execution.runner import ModelRunner, RunnerSettings
from workers.engine.sample.constraints import Constraint
from workers.engine.sample.grammars import GrammarCompiler
from workers.engine.sequences import Handover
from workers.engine.speculation.rows import may_speculate

from .conftest import Reference
from .test_speculative import CONFIG, PROMPTS, Oracle, run, spec_cache  # noqa: F401 (a fixture)
from .test_speculative_proposers import assert_sampling_unchanged, sampled_sequence
from .test_step_contract import load, new_sequence

MODEL = "local/tiny-llama"
# a strong bias towards a few tokens that the penalties then push down by what the history holds: which of them
# comes next hangs on every token before it, the drafts' too
FAVOURED = ["100", "200", "300", "400"]
PENALISED = [dict(repetition_penalty=1.6), dict(frequency_penalty=4.0, presence_penalty=0.5,
                                                 logit_bias={token: 40.0 for token in FAVOURED[:3]}),
             dict(repetition_penalty=5.0, logit_bias={token: 40.0 for token in FAVOURED}),
             dict(), dict(frequency_penalty=0.9, logprobs=2)]


@pytest.fixture(scope="module")
def loaded(spec_cache):
    return load(spec_cache, MODEL)


@pytest.fixture(scope="module")
def reference(spec_cache):
    return Reference(spec_cache, MODEL)


def one_token_steps(loaded, prompts: list[list[int]], rows: list[dict], max_tokens: int, constrain=None):
    """Each row's output without speculation (its tokens and entries handed over)."""
    runner = ModelRunner(loaded, RunnerSettings(max_rows=8))
    handover = Handover()
    sequences = [new_sequence(loaded, handover, ids, max_tokens, **row) for ids, row in zip(prompts, rows)]
    if constrain:
        constrain(sequences)
    run(runner, sequences)
    return sequences, handover.take()


def speculated(loaded, prompts, rows, max_tokens, expected, wrong_at, constrain=None, proposer=None):
    runner = ModelRunner(loaded, RunnerSettings(max_rows=8, speculative=CONFIG))
    handover = Handover()
    sequences = [new_sequence(loaded, handover, ids, max_tokens, **row) for ids, row in zip(prompts, rows)]
    if constrain:
        constrain(sequences)
    assert all(may_speculate(seq) for seq in sequences)
    runner.proposer = proposer or Oracle({id(seq): whole for seq, whole in zip(sequences, expected)
                                          if whole is not None}, wrong_at)
    run(runner, sequences)
    return sequences, handover.take(), runner.proposer.take_counts()


@pytest.mark.parametrize("wrong", ["right", "mixed"])
def test_penalised_rows_speculate_alone_and_batched_and_write_what_one_token_steps_write(loaded, reference, wrong):
    """Repetition, presence and frequency penalties and a logit bias: the penalties at each draft position see
    the drafts before it, so the output is the one-token steps' (and generate's, for the repetition penalty),
    alone and beside an unpenalised row, with drafts kept; logprobs inside runs are the one-token steps'."""
    wrong_at = (lambda seq, done: None) if wrong == "right" else (lambda seq, done: (done + seq.index) % 3)
    prompts = [reference.encode(prompt) for prompt in PROMPTS[1:1 + len(PENALISED)]]
    rows = [dict(row) for row in PENALISED]
    plain, plain_entries = one_token_steps(loaded, prompts, rows, 24)
    # the engine's repetition penalty is Hugging Face's: the penalised row's one-token output is generate's
    assert plain[0].completion_ids == reference.greedy(prompts[0], 24, min_new_tokens=24, repetition_penalty=1.6)
    assert plain[0].completion_ids != reference.greedy(prompts[0], 24, min_new_tokens=24)  # the penalty matters
    for alone in range(len(rows)):  # each penalised row alone
        if not rows[alone]:
            continue
        got, _, (drafts, _, accepted) = speculated(loaded, [prompts[alone]], [rows[alone]], 24,
                                                   [plain[alone].completion_ids + [0] * 6], wrong_at)
        assert got[0].completion_ids == plain[alone].completion_ids, rows[alone]
        assert drafts > 0 and accepted > 0
    got, entries, (drafts, drafted, accepted) = speculated(
        loaded, prompts, rows, 24, [seq.completion_ids + [0] * 6 for seq in plain], wrong_at)
    for seq, want in zip(got, plain):
        assert seq.completion_ids == want.completion_ids, seq.sampler.params
        assert seq.finish_reason == "length"
    assert drafts > 0 and accepted > (drafted // 2 if wrong == "right" else 0)
    logprobs = [(e[1], e[2]) for e in entries if e[0] is got[-1] and e[1] is not None]
    want_logprobs = [(e[1], e[2]) for e in plain_entries if e[0] is plain[-1] and e[1] is not None]
    assert [t for t, _ in logprobs] == [t for t, _ in want_logprobs]
    assert [v for _, v in logprobs] == pytest.approx([v for _, v in want_logprobs], abs=1e-4)


def test_penalised_rows_with_the_ngram_proposer_on_a_repeating_prompt(loaded, reference):
    """The real proposer: a prompt that repeats, rows whose biased and penalised output cycles through the
    favoured tokens (which lookups then find) beside plain ones; output is the one-token steps', drafts kept."""
    ids = reference.encode("one two three four five six one two three four five six one two three")
    ids += [int(token) for token in FAVOURED[:3]] * 3
    rows = [PENALISED[1], PENALISED[2], dict(frequency_penalty=0.6, presence_penalty=0.3)]
    plain, _ = one_token_steps(loaded, [ids] * len(rows), rows, 60)
    got, _, (drafts, _, accepted) = speculated(loaded, [ids] * len(rows), rows, 60, [None] * len(rows), None,
                                               proposer=_ngram(loaded))
    assert drafts > 0 and accepted > 0, (drafts, accepted)
    for seq, want in zip(got, plain):
        assert seq.completion_ids == want.completion_ids, seq.sampler.params


def _ngram(loaded):
    """The n-gram proposer with positions free (as on a GPU), so the width choice never stands in the way."""
    from workers.engine.speculation.rows import NgramProposer
    from workers.engine.speculation.step_cost import StepCost

    return NgramProposer(SpeculativeConfig("ngram", 3, 1, 3), cost=StepCost({1: 1.0, 2: 1.0}, measured=True))


COMPILER = GrammarCompiler()


def constrained(loaded, spec):
    template = COMPILER.submit(loaded.model_id, loaded.tokenizer, loaded.vocab_size, spec).result(timeout=60)

    def constrain(sequences):  # the first row only: the others decode beside it unconstrained
        sequences[0].constraint = Constraint(template.deep_copy())
    return constrain


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
GRAMMARS = [
    ({"type": "regex", "pattern": r"(one|two|three)( (one|two|three)){5,9}\."},
     lambda text: re.fullmatch(r"(one|two|three)( (one|two|three)){5,9}\.", text)),
    ({"type": "json_schema", "schema": PERSON}, lambda text: jsonschema.validate(json.loads(text), PERSON) or True),
]


@pytest.mark.parametrize("spec, valid", GRAMMARS, ids=["regex", "json_schema"])
def test_a_grammar_row_speculates_and_writes_what_one_token_steps_write(loaded, reference, spec, valid):
    """Drafts right, wrong, or refused by the grammar (a token it cannot take in the middle of a run): the
    grammar row's output is the one-token steps', valid for the grammar and complete ("stop"), beside an
    unconstrained penalised row; drafts the grammar takes are kept; the matcher ends complete."""
    constrain = constrained(loaded, spec)
    prompts = [reference.encode(PROMPTS[1]), reference.encode(PROMPTS[4])]
    rows = [dict(repetition_penalty=1.2), dict(frequency_penalty=0.5)]
    plain, _ = one_token_steps(loaded, prompts, rows, 80, constrain)
    text = reference.decode(plain[0].completion_ids)
    assert plain[0].finish_reason == "stop" and valid(text), text
    assert plain[0].constraint.complete
    refused = reference.encode(" {")[-1]  # the regex never takes it, the schema's output hardly past its start
    for name, wrong_at in (("right", lambda seq, done: None), ("mixed", lambda seq, done: (done + seq.index) % 3)):
        expected = [seq.completion_ids + [0] * 6 for seq in plain]
        got, _, (drafts, drafted, accepted) = speculated(loaded, prompts, rows, 80, expected, wrong_at, constrain)
        for seq, want in zip(got, plain):
            assert seq.completion_ids == want.completion_ids, (name, seq.index)
            assert seq.finish_reason == want.finish_reason
        assert got[0].constraint.complete  # the matcher stands after exactly the tokens kept
        assert drafts > 0 and accepted > (drafted // 3 if name == "right" else 0), (drafted, accepted)
    # drafts that the grammar refuses from the second one on: the run ends before them, nothing is fed
    expected = [seq.completion_ids + [0] * 6 for seq in plain]
    for whole in expected:
        for k in range(2, len(whole), 3):
            whole[k] = refused
    got, _, (drafts, _, accepted) = speculated(loaded, prompts[:1], rows[:1], 80, expected[:1],
                                               lambda seq, done: None, constrain)
    assert got[0].completion_ids == plain[0].completion_ids
    assert got[0].constraint.complete and accepted > 0


def test_a_grammar_whose_output_repeats_the_prompt_keeps_the_ngram_proposers_drafts(loaded, reference):
    """The real n-gram proposer: the prompt holds the words the grammar makes the row write, so lookups find
    them; drafts are kept and the output is the one-token steps'."""
    words = "one two three one two three one two three one two three"
    spec = {"type": "regex", "pattern": "( one two three){6}"}
    constrain = constrained(loaded, spec)
    ids = reference.encode(words)
    plain, _ = one_token_steps(loaded, [ids], [dict()], 60, constrain)
    assert reference.decode(plain[0].completion_ids) == " one two three" * 6
    got, _, (drafts, _, accepted) = speculated(loaded, [ids], [dict()], 60, [None], None, constrain,
                                               proposer=_ngram(loaded))
    assert got[0].completion_ids == plain[0].completion_ids
    assert drafts > 0 and accepted > 0


def test_sampled_penalised_rows_keep_their_distribution(loaded, reference):
    """Sampled rows with penalties verify drafts by drawing at every position under the penalties of the
    history with the drafts: the first three tokens' joint distribution equals plain sampling's (a bias makes
    three tokens the likely ones, and the penalties move the odds among them by what came before)."""
    ids = reference.encode(PROMPTS[1])
    penalties = dict(frequency_penalty=2.5, repetition_penalty=1.5, logit_bias={token: 40.0 for token in FAVOURED[:3]})
    params = dict(temperature=1.0, top_k=4, **penalties)
    first = new_sequence(loaded, Handover(), ids, 4, **penalties)
    run(ModelRunner(loaded, RunnerSettings(max_rows=4)), [first])
    assert_sampling_unchanged(loaded, lambda batch: [
        sampled_sequence(loaded, ids, 3, seed=1000 * batch + n, **params) for n in range(32)], first.completion_ids)


def test_sampled_grammar_rows_keep_their_distribution(loaded, reference):
    """A sampled row under a grammar draws at every draft position from the grammar's mask after the drafts
    before it: its first three tokens' joint distribution equals plain sampling's, every output valid."""
    pattern = r"( one| two| three| four){2,6}\."
    template = COMPILER.submit(loaded.model_id, loaded.tokenizer, loaded.vocab_size,
                               {"type": "regex", "pattern": pattern}).result(timeout=60)
    ids = reference.encode(PROMPTS[1])
    first = new_sequence(loaded, Handover(), ids, 30)
    first.constraint = Constraint(template.deep_copy())
    run(ModelRunner(loaded, RunnerSettings(max_rows=4)), [first])

    def constrained_batch(batch: int) -> list:
        sequences = [sampled_sequence(loaded, ids, 30, seed=1000 * batch + n, temperature=1.0) for n in range(32)]
        for seq in sequences:
            seq.constraint = Constraint(template.deep_copy())
        return sequences

    def valid(seq) -> None:
        assert re.fullmatch(pattern, reference.decode(seq.completion_ids)), seq.completion_ids

    assert_sampling_unchanged(loaded, constrained_batch, first.completion_ids, batches=12, check=valid)
