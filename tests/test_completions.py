"""/v1/completions through a real server, the real OpenAI SDK and a real tiny model."""
from __future__ import annotations

import asyncio

import pytest

from .conftest import TINY_MODEL

PROMPTS = ["Once upon a time", "The capital of France is", "def add(a, b):\n    return", "1, 2, 3,"]


def complete(client, **kwargs):
    kwargs.setdefault("model", TINY_MODEL)
    return client.completions.create(**kwargs)


def stream_text(client, **kwargs) -> tuple[str, list]:
    chunks = list(complete(client, stream=True, **kwargs))
    return "".join(c.choices[0].text for c in chunks if c.choices), chunks


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_output_equals_model_generate_token_for_token(client, reference, prompt):
    expected = reference.greedy(reference.encode(prompt), 24)
    result = complete(client, prompt=prompt, max_tokens=24, temperature=0, extra_body={"return_token_ids": True})
    choice = result.choices[0]
    assert choice.model_extra["token_ids"] == expected
    assert choice.text == reference.decode(expected)
    assert choice.model_extra["prompt_token_ids"] == reference.encode(prompt)  # flat, on the choice (vLLM's place)


def test_token_id_prompts_match_text_prompts(client, reference):
    ids = reference.encode(PROMPTS[0])
    by_text = complete(client, prompt=PROMPTS[0], max_tokens=12, temperature=0)
    by_ids = complete(client, prompt=ids, max_tokens=12, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)


def test_list_prompts_give_one_choice_each_in_order(client, reference):
    result = complete(client, prompt=PROMPTS[:3], max_tokens=10, temperature=0)
    assert [c.index for c in result.choices] == [0, 1, 2]
    for prompt, choice in zip(PROMPTS[:3], result.choices):
        assert choice.text == reference.decode(reference.greedy(reference.encode(prompt), 10))
    token_lists = [reference.encode(p) for p in PROMPTS[:2]]
    by_ids = complete(client, prompt=token_lists, max_tokens=10, temperature=0)
    assert [c.text for c in by_ids.choices] == [c.text for c in result.choices[:2]]


def test_response_shape_and_usage_match_the_tokenizer(client, reference):
    result = complete(client, prompt=PROMPTS[1], max_tokens=9, temperature=0)
    assert result.id.startswith("cmpl-")
    assert result.object == "text_completion"
    assert result.model == TINY_MODEL
    assert result.choices[0].finish_reason == "length"
    assert result.usage.prompt_tokens == len(reference.encode(PROMPTS[1]))
    assert result.usage.completion_tokens == 9
    assert result.usage.total_tokens == result.usage.prompt_tokens + 9


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.9, "seed": 1234, "top_p": 0.9}])
def test_streamed_text_joined_equals_the_whole_text(client, sampling):
    whole = complete(client, prompt=PROMPTS[0], max_tokens=30, **sampling)
    streamed, chunks = stream_text(client, prompt=PROMPTS[0], max_tokens=30, **sampling)
    assert streamed == whole.choices[0].text
    assert len(chunks) > 2
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_stream_usage_comes_last_when_asked(client, reference):
    chunks = list(complete(client, prompt=PROMPTS[2], max_tokens=7, stream=True, temperature=0,
                           stream_options={"include_usage": True}))
    assert chunks[-1].choices == []
    assert chunks[-1].usage.prompt_tokens == len(reference.encode(PROMPTS[2]))
    assert chunks[-1].usage.completion_tokens == 7
    assert all(c.usage is None for c in chunks[:-1])
    no_usage = list(complete(client, prompt=PROMPTS[2], max_tokens=3, stream=True))
    assert all(c.usage is None for c in no_usage)


def test_finish_reason_stop_on_eos(client, reference):
    eos = reference.tokenizer.eos_token_id
    result = complete(client, prompt=PROMPTS[0], max_tokens=20, logit_bias={str(eos): 100})
    assert result.choices[0].finish_reason == "stop"
    assert result.choices[0].text == ""
    assert result.usage.completion_tokens == 1


def test_ignore_eos_and_min_tokens_keep_generating(client, reference):
    eos = reference.tokenizer.eos_token_id
    ignored = complete(client, prompt=PROMPTS[0], max_tokens=6, logit_bias={str(eos): 100}, extra_body={"ignore_eos": True})
    assert ignored.choices[0].finish_reason == "length"
    assert ignored.usage.completion_tokens == 6
    delayed = complete(client, prompt=PROMPTS[0], max_tokens=6, logit_bias={str(eos): 100}, extra_body={"min_tokens": 3})
    assert delayed.choices[0].finish_reason == "stop"
    assert delayed.usage.completion_tokens == 4


def _stop_spanning_tokens(reference, prompt: str, max_tokens: int) -> tuple[str, str]:
    """A stop string that starts inside one generated token and ends inside a later one."""
    ids = reference.greedy(reference.encode(prompt), max_tokens)
    pieces = [reference.decode(ids[: i + 1]) for i in range(len(ids))]
    for i in range(3, len(ids) - 2):
        start, end = len(pieces[i - 1]), len(pieces[i])
        if end - start >= 2 and len(pieces[i + 1]) - end >= 1:
            stop = pieces[i + 1][end - 1 : end + 1]  # last char of token i + first of token i+1
            cut = pieces[-1].find(stop)
            return stop, pieces[-1][:cut]
    pytest.fail("no token boundary to test")


def test_stop_string_spanning_tokens_is_never_returned(client, reference):
    stop, expected = _stop_spanning_tokens(reference, PROMPTS[0], 40)
    result = complete(client, prompt=PROMPTS[0], max_tokens=40, temperature=0, stop=[stop, "zzzz-never"])
    assert result.choices[0].finish_reason == "stop"
    assert result.choices[0].text == expected
    streamed, chunks = stream_text(client, prompt=PROMPTS[0], max_tokens=40, temperature=0, stop=stop)
    assert streamed == expected
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(stop not in c.choices[0].text for c in chunks)


def test_n_choices_with_a_seed_are_distinct_and_reproducible(client):
    first = complete(client, prompt=PROMPTS[0], max_tokens=16, n=2, temperature=1.0, seed=7)
    again = complete(client, prompt=PROMPTS[0], max_tokens=16, n=2, temperature=1.0, seed=7)
    assert [c.index for c in first.choices] == [0, 1]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert first.choices[0].text != first.choices[1].text
    other = complete(client, prompt=PROMPTS[0], max_tokens=16, n=2, temperature=1.0, seed=8)
    assert [c.text for c in other.choices] != [c.text for c in first.choices]
    assert first.usage.completion_tokens == 32


def test_n_choices_stream_by_index(client):
    chunks = list(complete(client, prompt=PROMPTS[1], max_tokens=8, n=2, stream=True, seed=3, temperature=1.0))
    whole = complete(client, prompt=PROMPTS[1], max_tokens=8, n=2, seed=3, temperature=1.0)
    for choice in whole.choices:
        joined = "".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == choice.index)
        assert joined == choice.text


def test_echo_returns_the_prompt_then_the_completion(client):
    plain = complete(client, prompt=PROMPTS[3], max_tokens=8, temperature=0)
    echoed = complete(client, prompt=PROMPTS[3], max_tokens=8, temperature=0, echo=True)
    assert echoed.choices[0].text == PROMPTS[3] + plain.choices[0].text
    streamed, _ = stream_text(client, prompt=PROMPTS[3], max_tokens=8, temperature=0, echo=True)
    assert streamed == echoed.choices[0].text
    only_prompt = complete(client, prompt=PROMPTS[3], max_tokens=0, echo=True)
    assert only_prompt.choices[0].text == PROMPTS[3]


def test_logprobs_are_the_models_own(client, reference):
    import torch

    prompt_ids = reference.encode(PROMPTS[0])
    result = complete(client, prompt=PROMPTS[0], max_tokens=5, temperature=0, logprobs=3,
                      extra_body={"return_token_ids": True})
    logprobs = result.choices[0].logprobs
    ids = result.choices[0].model_extra["token_ids"]
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 5
    with torch.no_grad():
        logits = reference.model(torch.tensor([prompt_ids + ids])).logits[0]
    expected = torch.log_softmax(logits[len(prompt_ids) - 1 : -1], dim=-1)
    for position, token_id in enumerate(ids):
        assert logprobs.token_logprobs[position] == pytest.approx(float(expected[position, token_id]), abs=1e-4)
        top = logprobs.top_logprobs[position]
        assert len(top) >= 3
        assert max(top.values()) == pytest.approx(logprobs.token_logprobs[position], abs=1e-6)  # greedy = the top
    assert logprobs.text_offset[0] == 0
    assert logprobs.text_offset == sorted(logprobs.text_offset)


def test_echo_with_logprobs_scores_the_prompt(client, reference):
    prompt_ids = reference.encode(PROMPTS[1])
    result = complete(client, prompt=PROMPTS[1], max_tokens=3, temperature=0, echo=True, logprobs=1)
    logprobs = result.choices[0].logprobs
    assert len(logprobs.tokens) == len(prompt_ids) + 3
    assert logprobs.token_logprobs[0] is None
    assert all(isinstance(v, float) for v in logprobs.token_logprobs[1:])


def test_suffix_is_appended_after_the_completion(client):
    plain = complete(client, prompt=PROMPTS[0], max_tokens=6, temperature=0)
    with_suffix = complete(client, prompt=PROMPTS[0], max_tokens=6, temperature=0, suffix=" THE END")
    assert with_suffix.choices[0].text == plain.choices[0].text + " THE END"
    streamed, _ = stream_text(client, prompt=PROMPTS[0], max_tokens=6, temperature=0, suffix=" THE END")
    assert streamed == with_suffix.choices[0].text


def test_seed_gives_the_same_text_and_sampling_params_change_it(client):
    kwargs = dict(prompt=PROMPTS[2], max_tokens=20, temperature=1.2, top_k=50, seed=99)
    first = complete(client, **{k: v for k, v in kwargs.items() if k != "top_k"}, extra_body={"top_k": 50})
    second = complete(client, **{k: v for k, v in kwargs.items() if k != "top_k"}, extra_body={"top_k": 50})
    assert first.choices[0].text == second.choices[0].text
    greedy = complete(client, prompt=PROMPTS[2], max_tokens=20, temperature=0)
    assert first.choices[0].text != greedy.choices[0].text


def test_penalties_and_hf_extras_are_applied(client, reference):
    prompt = PROMPTS[3]
    greedy = reference.greedy(reference.encode(prompt), 20)
    expected = reference.greedy(reference.encode(prompt), 20, repetition_penalty=1.5, no_repeat_ngram_size=2)
    result = complete(client, prompt=prompt, max_tokens=20, temperature=0,
                      extra_body={"repetition_penalty": 1.5, "no_repeat_ngram_size": 2, "return_token_ids": True})
    assert result.choices[0].model_extra["token_ids"] == expected
    assert expected != greedy
    penalised = complete(client, prompt=prompt, max_tokens=20, temperature=0, frequency_penalty=2.0, presence_penalty=2.0,
                         extra_body={"return_token_ids": True})
    ids = penalised.choices[0].model_extra["token_ids"]
    assert len(set(ids)) > len(set(greedy))


def test_concurrent_requests_each_get_their_own_answer(async_client, client):
    alone = [complete(client, prompt=p, max_tokens=16, temperature=0).choices[0].text for p in PROMPTS]

    async def run_all():
        jobs = [async_client.completions.create(model=TINY_MODEL, prompt=p, max_tokens=16, temperature=0) for p in PROMPTS * 2]
        return await asyncio.gather(*jobs)

    together = asyncio.run(run_all())
    assert [r.choices[0].text for r in together] == alone * 2
