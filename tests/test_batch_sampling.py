"""The engine's batched step pieces against their one-row originals, without a server.

`choose_batch` must pick, for every row, what `Sampler.choose` picks for that row alone (same
seeded draw, same warping, same logprobs); the windowed detokenizer must give, token by token,
exactly the text of decoding the whole completion.
"""
from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoTokenizer

from protocol import JobParams
from workers.engine.sample.batch_sampling import choose_batch
from workers.engine.output.detokenizer import IncrementalText
from workers.engine.sample.sampling import Sampler, SamplingParams

from .conftest import TINY_MODEL

VOCAB = 300
EOS = [2]

ROWS = [
    dict(temperature=0),
    dict(temperature=0, logprobs=3),
    dict(temperature=0, ignore_eos=True),
    dict(temperature=0, min_tokens=5),
    dict(temperature=0.8, seed=11, top_p=0.9),
    dict(temperature=1.0, seed=5, top_k=20, min_p=0.05),
    dict(temperature=0.7, seed=42, logprobs=0),
    dict(temperature=1.3, seed=3, top_k=5, top_p=0.5, min_p=0.2, logprobs=5),
    dict(temperature=0, frequency_penalty=1.5, presence_penalty=0.5),  # one by one: needs the history
    dict(temperature=0, repetition_penalty=1.3),
    dict(temperature=0, logit_bias={"7": 5.0}),
    dict(temperature=0.9, seed=8, typical_p=0.8),
]


def sampler(row: dict, offset: int = 0) -> Sampler:
    params = SamplingParams.from_job(JobParams(**row), {})
    return Sampler(params, EOS, torch.device("cpu"), seed_offset=offset)


def assert_same_choice(batched, alone) -> None:
    assert (batched is None) == (alone is None)
    if alone is None:
        return
    assert batched.token_id == alone.token_id
    assert batched.logprob == alone.logprob
    assert [t for t, _ in batched.top] == [t for t, _ in alone.top]
    assert [v for _, v in batched.top] == pytest.approx([v for _, v in alone.top], abs=0)


@pytest.mark.parametrize("step", range(6))
def test_a_batch_chooses_what_each_row_chooses_alone(step):
    torch.manual_seed(step)
    logits = torch.randn(len(ROWS), VOCAB) * 3
    histories = [([1, 5, 9], [random.Random(step * 31 + i).randrange(VOCAB) for _ in range(step)]) for i in range(len(ROWS))]
    alone_samplers = [sampler(row) for row in ROWS]
    batch_samplers = [sampler(row) for row in ROWS]
    alone = [s.choose(logits[i], *histories[i], None) for i, s in enumerate(alone_samplers)]
    batched = choose_batch(batch_samplers, logits, histories, [None] * len(ROWS))
    for got, want in zip(batched, alone):
        assert_same_choice(got, want)


def test_penalties_kept_across_steps_choose_what_each_row_chooses_alone_with_its_whole_history():
    """The persistent batch's penalty tensors (built from the histories once, then updated with each step's
    tokens) give every row, at every step, what `Sampler.choose` gives it alone from its whole history."""
    from workers.engine.sample.batch_sampling import SamplingColumns

    rows = [dict(temperature=0, repetition_penalty=1.3), dict(temperature=0, frequency_penalty=1.5, presence_penalty=0.5),
            dict(temperature=0.9, seed=4, top_k=30, frequency_penalty=0.7, logit_bias={"7": 3.0, "9": -2.0}),
            dict(temperature=0), dict(temperature=0, repetition_penalty=0.8, presence_penalty=-0.4, logprobs=2)]
    alone, batched = [sampler(row) for row in rows], [sampler(row) for row in rows]
    columns = SamplingColumns(batched)
    assert not columns.one_by_one and columns.penalties.active
    histories = [([1, 5, 9, 5], [3]) for _ in rows]
    for step in range(12):
        torch.manual_seed(700 + step)
        logits = torch.randn(len(rows), VOCAB) * 2
        logits[:, [3, 5, 7, 9]] += 4  # tokens the histories hold, so the penalties decide
        want = [s.choose(logits[i], *histories[i], None) for i, s in enumerate(alone)]
        ids, logprobs, one_by_one = columns.pick(logits.clone(), [len(h[1]) for h in histories],
                                                 histories.__getitem__, [None] * len(rows))
        assert not one_by_one
        assert ids == [choice.token_id for choice in want], step
        assert logprobs[4][0] == want[4].logprob
        for history, token in zip(histories, ids):
            history[1].append(token)


def test_seeded_rows_draw_the_same_sequence_in_a_batch_as_alone():
    """Ten steps of a seeded row: its generator advances the same way whatever rows share the step."""
    row = dict(temperature=1.0, seed=1234, top_p=0.95)
    alone, batched = sampler(row), [sampler(row), sampler(dict(temperature=0)), sampler(dict(temperature=0.5, seed=9))]
    for step in range(10):
        torch.manual_seed(100 + step)
        logits = torch.randn(3, VOCAB)
        want = alone.choose(logits[0], [1], [], None)
        got = choose_batch(batched, logits, [([1], [])] * 3, [None] * 3)[0]
        assert got.token_id == want.token_id


def test_eos_is_held_off_and_grammar_masks_apply_per_row():
    logits = torch.zeros(3, VOCAB)
    logits[:, EOS[0]] = 10.0  # EOS would win
    samplers = [sampler(dict(temperature=0, ignore_eos=True)), sampler(dict(temperature=0)),
                sampler(dict(temperature=0, min_tokens=3))]
    allowed = torch.zeros(VOCAB, dtype=torch.bool)
    allowed[[40, 41]] = True
    logits[1, 41] = 1.0
    nothing = torch.zeros(VOCAB, dtype=torch.bool)
    choices = choose_batch(samplers, logits, [([1], []), ([1], []), ([1], [5])], [None, allowed, None])
    assert choices[0].token_id != EOS[0]
    assert choices[1].token_id == 41  # the grammar's best, not EOS
    assert choices[2].token_id != EOS[0]  # one token of three generated
    dead = choose_batch([sampler(dict(temperature=0))], logits[:1], [([1], [])], [nothing])
    assert dead == [None]


@pytest.fixture(scope="module")
def tokenizer(hf_cache):
    return AutoTokenizer.from_pretrained(TINY_MODEL, cache_dir=hf_cache, local_files_only=True)


@pytest.mark.parametrize("every", [1, 3])
@pytest.mark.parametrize("seed", range(4))
def test_the_windowed_text_is_the_whole_decode_at_every_token(tokenizer, seed, every):
    """Random ids (byte pieces of split characters among them), and a real sentence's ids; read at every token
    (a stream) or every third (a non-streamed answer reads several new tokens at once)."""
    rng = random.Random(seed)
    sentence = tokenizer("Héllo wörld — 日本語 and emoji 🙂🙂, then plain words again.", add_special_tokens=False)["input_ids"]
    ids = sentence if seed == 0 else [rng.randrange(len(tokenizer)) for _ in range(80)]
    text = IncrementalText(tokenizer, [])
    emitted = ""
    for n in [*range(every, len(ids), every), len(ids)]:
        delta, stopped = text.update(ids[:n])
        emitted += delta
        assert not stopped
        whole = tokenizer.decode(ids[:n], skip_special_tokens=True, clean_up_tokenization_spaces=False)
        assert text.text == whole
        assert whole.startswith(emitted)
    emitted += text.flush()
    assert emitted == tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def test_a_stop_string_across_tokens_ends_the_text_before_it(tokenizer):
    ids = tokenizer("one two three four", add_special_tokens=False)["input_ids"]
    text = IncrementalText(tokenizer, [" three"])
    out, stopped = "", False
    for n in range(1, len(ids) + 1):
        delta, stopped = text.update(ids[:n])
        out += delta
        if stopped:
            break
    assert stopped and out == "one two"


def test_each_row_is_warped_exactly_as_hugging_face_warps_it_alone():
    """Per-row top-k / top-p / min-p over a batch equal Hugging Face's warpers on each row (bit for bit)."""
    from transformers.generation.logits_process import MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    from workers.engine.sample.batch_sampling import _min_p, _top_k, _top_p

    torch.manual_seed(7)
    scores = torch.randn(5, VOCAB) * 2
    ks, ps, mins = [0, 1, 7, 50, VOCAB + 5], [1.0, 0.9, 0.5, 0.05, 0.999], [0.0, 0.1, 0.3, 0.05, 0.9]
    for warp, values, warper in ((_top_k, ks, TopKLogitsWarper), (_top_p, ps, TopPLogitsWarper),
                                 (_min_p, mins, MinPLogitsWarper)):
        batched = warp(scores.clone(), values)
        for row, value in enumerate(values):
            off = value == (0 if warp is not _top_p else 1.0) or (warp is _min_p and value == 0.0)
            alone = scores[row:row + 1] if off else warper(value)(None, scores[row:row + 1].clone())
            assert torch.equal(batched[row], alone[0]), (warp.__name__, value)


def test_an_allowed_token_set_is_honoured_beside_batched_rows():
    """vLLM's allowed_token_ids: the row keeps to its set while the other rows are batched."""
    torch.manual_seed(3)
    logits = torch.randn(2, VOCAB)
    samplers = [sampler(dict(temperature=0, allowed_token_ids=[11, 12])), sampler(dict(temperature=0))]
    choices = choose_batch(samplers, logits, [([1], []), ([1], [])], [None, None])
    assert choices[0].token_id in (11, 12)
    assert choices[1].token_id == int(logits[1].argmax())


def test_tokens_the_model_rules_out_are_reported_at_the_lowest_logprob_never_as_infinity():
    """A model's scores of -inf (tokens it masks) have a logprob of -inf, which JSON cannot carry: reported as
    -9999.0 (vLLM's floor) by a batch and by a row alone, and the order of the alternatives kept."""
    import json

    from workers.engine.sample.sampling import LOWEST_LOGPROB

    logits = torch.full((2, VOCAB), float("-inf"))
    logits[:, 4], logits[:, 8], logits[:, 15] = 2.0, 1.0, 0.5  # three tokens the model allows
    rows = [dict(temperature=0, logprobs=5), dict(temperature=0.8, seed=3, logprobs=5)]
    histories = [([1, 5, 9], []) for _ in rows]
    batched = choose_batch([sampler(row) for row in rows], logits, histories, [None] * len(rows))
    alone = [sampler(row).choose(logits[i], *histories[i], None) for i, row in enumerate(rows)]
    for got, want in zip(batched, alone):
        assert_same_choice(got, want)
        assert [t for t, _ in got.top][:3] == [4, 8, 15]
        assert [v for _, v in got.top][3:] == [LOWEST_LOGPROB, LOWEST_LOGPROB]
        json.dumps({"logprob": got.logprob, "top": got.top}, allow_nan=False)  # finite: valid JSON
