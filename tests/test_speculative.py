"""Speculative decoding at the runner: drafts verified inside the batched step leave greedy output exactly
what one-token steps (and `model.generate`) write, for every family that speculates, with rows that propose
beside rows that do not, through joins, pauses and leaves, with max_tokens and stop ids inside an accepted
run, logprobs, and from the prefix cache; models whose caches cannot drop rejected drafts decode without.

Random-weight models rarely repeat their prompt, so most tests feed the verifier drafts known to be right
(the reference's own continuation) and known to be wrong (the same, corrupted at a chosen place): both
must give the same output, and the right ones must be accepted.
"""
from __future__ import annotations

import random
import uuid

import numpy
import pytest

import protocol
from workers.engine.execution.input_batch import InputBatch
from workers.engine.execution.runner import ModelRunner, RunnerSettings, sample_batch
from workers.engine.plan import DecodePlan
from workers.engine.sequences import Handover
from protocol.speculative import SpeculativeConfig
from workers.engine.speculation.rows import NgramProposer, RowSpeculation, may_speculate
from workers.engine.step_clock import StepClock
from workers.tiny.families import build_tiny_families

from .conftest import Reference
from .test_step_contract import load, new_sequence, start

SPECULATING = ["llama", "qwen2", "qwen3", "qwen3-moe", "olmo2", "gpt2", "gpt-neox", "opt", "bloom", "falcon", "falcon-alibi",
               "granite", "smollm3", "cohere", "deepseek-v3"]  # every full-attention family of the suite
# sliding windows and recurrent states that continue over several tokens: one row at a time
ALONE = ["mistral", "phi3", "cohere2", "gemma3", "qwen2-sliding", "gemma2", "gpt-oss", "qwen3.5", "qwen3-next", "bamba"]
DECLINED = ["jamba", "mamba"]  # recurrent layers that restart on a multi-token input
PROMPTS = ["Hi", "Once upon a time there was a lighthouse keeper", "1, 2, 3,", "def add(a, b):",
           "The capital of France is a city where the river bends twice", "A", "Tell me a story about a cat"]
CONFIG = SpeculativeConfig("ngram", 4, 2, 4)


@pytest.fixture(scope="module")
def spec_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("spec-families")
    build_tiny_families(SPECULATING + ALONE + DECLINED, cache_dir=cache)
    return cache


class Oracle(NgramProposer):
    """Drafts from the reference's own continuation: right, or wrong from a chosen draft on (`wrong_at`
    by row: None right, k the k-th draft wrong); rows not in `expected` propose nothing."""

    def __init__(self, expected: dict[int, list[int]], wrong_at, count: int = 4) -> None:
        super().__init__(SpeculativeConfig("ngram", count))
        self.expected, self.wrong_at, self.count = expected, wrong_at, count

    def propose(self, rows, waiting=False):
        proposals = {}
        if self.alone and len(rows) > 1:
            return proposals
        for i, seq in enumerate(rows):
            whole = self.expected.get(id(seq))
            if whole is None or not may_speculate(seq):
                continue
            seq.speculation = seq.speculation or RowSpeculation(seq.prompt_ids)
            done = len(seq.completion_ids)
            drafts = list(whole[done:done + self.count])  # past max_tokens too: those are never taken
            wrong = self.wrong_at(seq, done)
            if wrong is not None and wrong < len(drafts):
                drafts[wrong] = (drafts[wrong] + 1) % 50
            if drafts:
                proposals[i] = drafts
        return proposals


def run(runner: ModelRunner, sequences: list, joins: dict[int, list] | None = None) -> None:
    """Start `sequences`, then step until every row ended; `joins[step]` start at that step."""
    for seq in sequences:
        start(runner, seq)
    step = 0
    while runner.running or (joins and any(s >= step for s in joins)):
        for seq in (joins or {}).pop(step, []):
            start(runner, seq)
        if runner.running:
            runner.execute(DecodePlan(runner.view(), StepClock())).apply()
            runner.drop_finished()
        step += 1


@pytest.mark.parametrize("family", SPECULATING)
def test_drafts_right_or_wrong_leave_greedy_output_as_generate_writes_it(spec_cache, family):
    model = f"local/tiny-{family}"
    loaded, reference = load(spec_cache, model), Reference(spec_cache, model)
    for kind, wrong_at in (("right", lambda seq, done: None), ("mixed", lambda seq, done: (done + seq.index) % 3),
                           ("wrong", lambda seq, done: 0)):
        runner = ModelRunner(loaded, RunnerSettings(max_rows=8, speculative=CONFIG))
        assert runner.proposer is not None
        handover, expected, sequences = Handover(), {}, []
        for n, prompt in enumerate(PROMPTS[:4]):
            ids, tokens = reference.encode(prompt), 7 + 3 * n
            seq = new_sequence(loaded, handover, ids, tokens)
            expected[id(seq)] = reference.greedy(ids, tokens + 6, min_new_tokens=tokens + 6)
            sequences.append(seq)
        # the last row proposes nothing: it decodes one token a step beside the others
        oracle = Oracle({key: value for key, value in expected.items() if key != id(sequences[-1])}, wrong_at)
        runner.proposer = oracle
        run(runner, sequences)
        for seq in sequences:
            assert seq.completion_ids == expected[id(seq)][:seq.max_tokens], (family, seq.index)
            assert seq.finish_reason == "length"
        drafts, drafted, accepted = oracle.take_counts()
        assert drafts > 0
        if kind == "right":
            assert accepted > drafted // 2  # right drafts are kept (all but those past max_tokens)
        elif kind == "wrong":
            assert accepted == 0
        tokens_handed = [entry[1] for entry in handover.take() if entry[1] is not None]
        assert len(tokens_handed) == sum(seq.max_tokens for seq in sequences)  # nothing past max_tokens


def test_rows_join_pause_and_leave_while_others_verify(spec_cache):
    """Holes that rejected drafts leave in rows are closed when rows pause or leave; joins land after them."""
    model = "local/tiny-llama"
    loaded, reference = load(spec_cache, model), Reference(spec_cache, model)
    runner = ModelRunner(loaded, RunnerSettings(max_rows=8, speculative=CONFIG))
    rng = random.Random(7)
    handover, expected, every, waiting, paused = Handover(), {}, [], list(PROMPTS), []
    runner.proposer = Oracle(expected, lambda seq, done: rng.choice([None, 0, 1, 2, 3]))
    for step in range(80):
        if waiting and (not runner.running or rng.random() < 0.3):
            ids, tokens = reference.encode(waiting.pop(0)), rng.randrange(5, 16)
            seq = new_sequence(loaded, handover, ids, tokens)
            expected[id(seq)] = reference.greedy(ids, tokens + 6, min_new_tokens=tokens + 6)
            start(runner, seq)
            every.append(seq)
        if paused and rng.random() < 0.5:
            runner.join([paused.pop(0)])
        elif runner.running > 1 and rng.random() < 0.2:
            seq = rng.choice(runner.rows)
            runner.pause([seq])
            paused.append(seq)
        runner.drop_finished()
        if not runner.running:
            if not waiting and not paused:
                break
            continue
        runner.execute(DecodePlan(runner.view(), StepClock())).apply()
        slab = runner.batch
        assert [int(slab.mask[row, slab.start:slab.end].sum()) for row in range(slab.rows)] == slab.lengths
    assert not waiting and not paused
    for seq in every:
        assert seq.completion_ids == expected[id(seq)][:seq.max_tokens]


def test_a_stop_id_inside_an_accepted_run_ends_the_choice_there(spec_cache):
    model = "local/tiny-llama"
    loaded, reference = load(spec_cache, model), Reference(spec_cache, model)
    ids = reference.encode(PROMPTS[1])
    whole = reference.greedy(ids, 20, min_new_tokens=20)
    stop = whole[6]
    runner = ModelRunner(loaded, RunnerSettings(max_rows=8, speculative=CONFIG))
    handover = Handover()
    seq = new_sequence(loaded, handover, ids, 20, stop_token_ids=[stop])
    runner.proposer = Oracle({id(seq): whole}, lambda seq, done: None)
    run(runner, [seq])
    assert seq.completion_ids == whole[:whole.index(stop) + 1]
    assert seq.finish_reason == "stop"
    entries = handover.take()
    assert [entry[1] for entry in entries] == [*seq.completion_ids, None]  # nothing after the stop id


def test_logprobs_inside_an_accepted_run_are_the_one_token_steps(spec_cache):
    model = "local/tiny-llama"
    loaded, reference = load(spec_cache, model), Reference(spec_cache, model)
    ids = reference.encode(PROMPTS[4])
    whole = reference.greedy(ids, 16, min_new_tokens=16)
    results = []
    for speculate in (False, True):
        runner = ModelRunner(loaded, RunnerSettings(max_rows=8, speculative=CONFIG if speculate else None))
        handover = Handover()
        seq = new_sequence(loaded, handover, ids, 10, logprobs=3)
        if speculate:
            runner.proposer = Oracle({id(seq): whole}, lambda seq, done: 2 if done % 2 else None)
        run(runner, [seq])
        results.append([(entry[1], entry[2], [t for t, _ in entry[3]]) for entry in handover.take() if entry[1]])
    plain, verified = results
    assert [r[0] for r in verified] == [r[0] for r in plain] == whole[:10]
    assert [r[2] for r in verified] == [r[2] for r in plain]
    assert numpy.allclose([r[1] for r in verified], [r[1] for r in plain], atol=1e-4)


def test_a_prompt_from_the_prefix_cache_speculates_the_same(spec_cache):
    model = "local/tiny-gpt2"
    loaded, reference = load(spec_cache, model), Reference(spec_cache, model)
    runner = ModelRunner(loaded, RunnerSettings(max_rows=8, prefix_cache_bytes=1 << 24, speculative=CONFIG))
    ids = reference.encode(" ".join(PROMPTS) * 2)
    whole = reference.greedy(ids, 18, min_new_tokens=18)
    for _ in range(2):
        seq = new_sequence(loaded, Handover(), ids, 12)
        cached = runner.attach_prefix(seq)
        runner.proposer = Oracle({id(seq): whole}, lambda seq, done: 1 if done % 3 == 0 else None)
        _, logits = runner.prefill(seq, len(seq.prompt_ids))
        runner.remember_prefix(seq)
        sample_batch(InputBatch([seq]), logits[None]).apply()
        runner.join([seq])
        run(runner, [])
        assert seq.completion_ids == whole[:12]
    assert cached  # the second prompt started from the cache


@pytest.mark.parametrize("family", ALONE)
def test_sliding_and_recurrent_models_verify_while_one_row_decodes(spec_cache, family):
    """Past the window (16 tokens), one row's drafts right, wrong or mixed: generate's output; with two rows
    nothing is proposed (a hole would break the window of columns) and the output is generate's too."""
    model = f"local/tiny-{family}"
    loaded, reference = load(spec_cache, model), Reference(spec_cache, model)
    for right, wrong_at in ((True, lambda seq, done: None), (False, lambda seq, done: done % 3),
                            (False, lambda seq, done: 0)):
        runner = ModelRunner(loaded, RunnerSettings(max_rows=8, speculative=CONFIG))
        assert runner.proposer is not None and runner.proposer.alone
        ids = reference.encode(PROMPTS[4])
        seq = new_sequence(loaded, Handover(), ids, 30)
        whole = reference.greedy(ids, 36, min_new_tokens=36)
        oracle = runner.proposer = Oracle({id(seq): whole}, wrong_at)
        oracle.alone = True
        run(runner, [seq])
        assert seq.completion_ids == whole[:30], family
        drafts, drafted, accepted = oracle.take_counts()
        assert drafts > 0 and (accepted > drafted // 2 if right else True)
    pair = [new_sequence(loaded, Handover(), reference.encode(prompt), 20) for prompt in PROMPTS[1:3]]
    oracle = runner.proposer = Oracle({id(s): reference.greedy(s.prompt_ids, 26, min_new_tokens=26) for s in pair},
                                      lambda seq, done: None)
    oracle.alone = True
    run(runner, pair)
    for s in pair:
        assert s.completion_ids == oracle.expected[id(s)][:20]
    assert oracle.take_counts()[0] == 0


@pytest.mark.parametrize("family", DECLINED)
def test_caches_that_cannot_drop_drafts_decode_without(spec_cache, family, caplog):
    caplog.set_level("INFO")
    loaded = load(spec_cache, f"local/tiny-{family}")
    runner = ModelRunner(loaded, RunnerSettings(max_rows=4, speculative=CONFIG))
    assert runner.proposer is None
    assert f"speculative decoding off for local/tiny-{family}" in caplog.text


def test_the_ngram_proposer_on_a_repeating_prompt_leaves_output_unchanged(spec_cache):
    """The real proposer: a prompt that repeats finds matches every step; output equals generate's."""
    model = "local/tiny-llama"
    loaded, reference = load(spec_cache, model), Reference(spec_cache, model)
    ids = reference.encode("one two three four five six one two three four five six one two three")
    whole = reference.greedy(ids, 40, min_new_tokens=40)
    runner = ModelRunner(loaded, RunnerSettings(max_rows=4, speculative=SpeculativeConfig("ngram", 3, 1, 3)))
    seq = new_sequence(loaded, Handover(), ids, 40)
    run(runner, [seq])
    assert seq.completion_ids == whole
    assert runner.proposer.drafts > 0


class PromptOracle(NgramProposer):
    """Drafts known right, by prompt (an engine makes its sequences itself); counts what it had accepted."""

    def __init__(self, expected: dict[tuple, list[int]]) -> None:
        super().__init__(CONFIG)
        self.expected, self.kept_in_all = expected, 0

    def propose(self, rows, waiting=False):
        proposals = {}
        for i, seq in enumerate(rows):
            whole = self.expected.get(tuple(seq.prompt_ids))
            if whole is not None and may_speculate(seq):
                seq.speculation = seq.speculation or RowSpeculation(seq.prompt_ids)
                drafts = whole[len(seq.completion_ids):len(seq.completion_ids) + 4]
                if drafts:
                    proposals[i] = drafts
        return proposals

    def verified(self, rows, proposals, kept) -> None:
        self.kept_in_all += sum(kept[i] - 1 for i in proposals)
        super().verified(rows, proposals, kept)


def test_a_stop_string_inside_an_accepted_run_is_never_shown_nor_billed(spec_cache):
    """The output thread finds a stop string inside a run of tokens a step accepted: the client's text, token
    ids and usage end where they would without speculation."""
    from workers.engine.config import EngineConfig

    from .conftest import engine_running
    from .outbox import Outbox

    model = "local/tiny-llama"
    reference = Reference(spec_cache, model)
    prompt = reference.encode("Once upon a time there was")
    whole = reference.greedy(prompt, 24, min_new_tokens=24)
    cut = next(n for n in range(7, 20) if reference.decode(whole[:n]) != reference.decode(whole[:n - 1]))
    stop = reference.decode(whole[:cut])[len(reference.decode(whole[:cut - 1])):]
    full = reference.decode(whole)
    outbox = Outbox()
    ref = protocol.ModelRef.parse(model)

    def submit(ids: list[int], **params) -> str:
        reply = f"reply.{uuid.uuid4().hex}"
        engine.submit(protocol.submit_message(f"cmpl-{uuid.uuid4().hex}", reply, ref, [ids], protocol.JobParams(
            temperature=0, ignore_eos=True, **params)))
        outbox.wait([reply])
        return reply

    with engine_running(spec_cache, outbox.emit, EngineConfig(max_num_seqs=4, speculative=CONFIG)) as engine:
        submit([1, 2, 3], max_tokens=2)  # loads the model
        oracle = engine.runners[ref.key].proposer = PromptOracle({tuple(prompt): whole})
        reply = submit(prompt, max_tokens=24, stop=[stop])
    assert oracle.kept_in_all >= 4  # the stop string's token came in an accepted run
    done = outbox.messages[reply][-1]
    text = "".join(choice["text"] for message in outbox.messages[reply] for choice in message.get("choices", []))
    assert text == full[:full.index(stop)]
    ids = outbox.choices(reply)[0]["ids"]
    assert ids == whole[:len(ids)] and stop not in reference.decode(ids[:-1])
    assert done["usage"]["completion_tokens"] == len(ids)


def test_static_decode_steps_between_verifying_steps_stay_exact(spec_cache):
    """Verifying steps run over the window; the static program's steps between them read the holes they left
    from the slab's mask: output stays generate's."""
    model = "local/tiny-llama"
    loaded, reference = load(spec_cache, model), Reference(spec_cache, model)
    runner = ModelRunner(loaded, RunnerSettings(max_rows=8, static_decode=True, speculative=CONFIG))
    assert runner.static is not None
    handover, expected, sequences = Handover(), {}, []
    for n, prompt in enumerate(PROMPTS[:4]):
        ids = reference.encode(prompt)
        seq = new_sequence(loaded, handover, ids, 8 + 3 * n)
        expected[id(seq)] = reference.greedy(ids, seq.max_tokens + 6, min_new_tokens=seq.max_tokens + 6)
        sequences.append(seq)
    # drafts every other step, wrong for some rows: holes, then static steps over them
    runner.proposer = Oracle(expected, lambda seq, done: None if len(seq.prompt_ids) % 2 else 1)
    propose = runner.proposer.propose
    runner.proposer.propose = (lambda rows, waiting=False:
                               propose(rows, waiting) if sum(len(s.completion_ids) for s in rows) % 2 else {})
    run(runner, sequences)
    for seq in sequences:
        assert seq.completion_ids == expected[id(seq)][:seq.max_tokens]


def test_a_prompt_prefilled_in_chunks_then_verified_is_generates(spec_cache):
    model = "local/tiny-llama"
    loaded, reference = load(spec_cache, model), Reference(spec_cache, model)
    runner = ModelRunner(loaded, RunnerSettings(max_rows=8, prefill_chunk=16, speculative=CONFIG))
    ids = reference.encode(" ".join(PROMPTS))
    whole = reference.greedy(ids, 20, min_new_tokens=20)
    seq = new_sequence(loaded, Handover(), ids, 14)
    runner.proposer = Oracle({id(seq): whole}, lambda seq, done: 2 if done % 4 == 1 else None)
    chunks, logits = 0, None
    while logits is None:
        _, logits = runner.prefill(seq, 16)
        chunks += 1
    assert chunks > 2
    sample_batch(InputBatch([seq]), logits[None]).apply()
    runner.join([seq])
    run(runner, [])
    assert seq.completion_ids == whole[:14]
