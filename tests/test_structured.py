"""Structured outputs, enforced tool choice and beam search through the real server and the `openai` SDK.

The tiny model has random weights, so anything it writes that parses and validates is the
grammar's doing; batched unconstrained requests must still equal their output run alone.
"""
from __future__ import annotations

import asyncio
import json
import re

import httpx
import jsonschema
import pytest

from .conftest import TINY_MODEL
from .helpers.schemas import PERSON

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["city", "unit"],
    "properties": {"city": {"type": "string", "maxLength": 6}, "unit": {"enum": ["C", "F"]}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["zone"],
    "properties": {"zone": {"enum": ["UTC", "CET"]}}}}}
USER = [{"role": "user", "content": "Describe someone."}]
PERSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


@pytest.fixture(scope="module", autouse=True)
def warm_worker(server):
    """A cold worker imports torch on its first job; on a loaded machine that can outlast the ack timeout."""
    for _ in range(5):
        response = httpx.post(f"{server.base_url}/v1/completions", headers=server.headers, timeout=120,
                              json={"model": TINY_MODEL, "prompt": "warm", "max_tokens": 1})
        if response.status_code == 200:
            return
    pytest.fail(f"the worker never took a job: {response.text}")


def test_chat_json_schema_streamed_and_not_with_several_choices(client):
    answer = client.chat.completions.create(model=TINY_MODEL, messages=USER, n=3, temperature=1.0, seed=1,
                                            max_tokens=200, response_format=PERSON_FORMAT)
    for choice in answer.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), PERSON)
    stream = client.chat.completions.create(model=TINY_MODEL, messages=USER, n=2, temperature=1.0, seed=2,
                                            max_tokens=200, response_format=PERSON_FORMAT, stream=True)
    texts = ["", ""]
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    for text in texts:
        jsonschema.validate(json.loads(text), PERSON)


def test_json_object_gives_an_object(client):
    answer = client.chat.completions.create(model=TINY_MODEL, messages=USER, temperature=0, max_tokens=300,
                                            response_format={"type": "json_object"})
    if answer.choices[0].finish_reason == "stop":  # an unbounded object may still run to max_tokens
        assert isinstance(json.loads(answer.choices[0].message.content), dict)
    else:
        assert answer.choices[0].message.content.startswith("{")


def test_unconstrained_requests_batched_with_constrained_ones_equal_their_output_alone(client, async_client):
    prompts = [f"Story {i}: once upon a time" for i in range(4)]
    alone = [client.completions.create(model=TINY_MODEL, prompt=p, max_tokens=20, temperature=0).choices[0].text
             for p in prompts]

    async def together():
        plain = [async_client.completions.create(model=TINY_MODEL, prompt=p, max_tokens=20, temperature=0)
                 for p in prompts]
        constrained = [async_client.completions.create(
            model=TINY_MODEL, prompt=p, max_tokens=200, temperature=1.0, seed=i,
            extra_body={"structured_outputs": {"json": PERSON}}) for i, p in enumerate(prompts)]
        results = await asyncio.gather(*plain, *constrained)
        return results[:4], results[4:]

    plain, constrained = asyncio.run(together())
    assert [r.choices[0].text for r in plain] == alone
    for result in constrained:
        jsonschema.validate(json.loads(result.choices[0].text), PERSON)


@pytest.mark.parametrize("structured, check", [
    ({"regex": "[A-Z][a-z]{2,6} [0-9]{2}"}, lambda t: re.fullmatch("[A-Z][a-z]{2,6} [0-9]{2}", t)),
    ({"choice": ["positive", "negative", "neutral"]}, lambda t: t in ("positive", "negative", "neutral")),
])
def test_completions_regex_and_choice_streamed_and_not(client, structured, check):
    answer = client.completions.create(model=TINY_MODEL, prompt="Label:", n=3, temperature=1.0, seed=4,
                                       max_tokens=30, extra_body={"structured_outputs": structured})
    assert all(check(choice.text) for choice in answer.choices), [c.text for c in answer.choices]
    stream = client.completions.create(model=TINY_MODEL, prompt="Label:", temperature=1.0, seed=5, max_tokens=30,
                                       stream=True, extra_body={"structured_outputs": structured})
    assert check("".join(chunk.choices[0].text for chunk in stream if chunk.choices))


def _check_calls(message, tools: list[dict]) -> list[str]:
    parameters = {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}
    assert message.tool_calls, message
    for call in message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), parameters[call.function.name])
    return [call.function.name for call in message.tool_calls]


def test_tool_choice_required_and_named_force_a_valid_call(client):
    answer = client.chat.completions.create(model=TINY_MODEL, messages=USER, tools=[WEATHER, TIME], n=3,
                                            tool_choice="required", temperature=1.0, seed=3)
    for choice in answer.choices:
        assert choice.finish_reason == "tool_calls"
        _check_calls(choice.message, [WEATHER, TIME])
    named = client.chat.completions.create(model=TINY_MODEL, messages=USER, tools=[WEATHER, TIME], temperature=1.0,
                                           seed=4, n=2,
                                           tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert all(_check_calls(choice.message, [TIME]) == ["get_time"] for choice in named.choices)


def test_tool_choice_none_never_calls(client, reference):
    """A request pushed to open a tool call (logit_bias) is kept from it under "none"."""
    tag = str(reference.tokenizer.convert_tokens_to_ids("<tool_call>"))
    body = dict(model=TINY_MODEL, messages=USER, tools=[WEATHER], temperature=0, max_tokens=10, logit_bias={tag: 100})
    pushed = client.chat.completions.create(**body).choices[0].message
    assert pushed.tool_calls or "<tool_call>" in pushed.content
    kept = client.chat.completions.create(**body, tool_choice="none").choices[0].message
    assert not kept.tool_calls and "<tool_call>" not in (kept.content or "")


def test_responses_text_format_and_forced_tool(client):
    response = client.responses.create(model=TINY_MODEL, input="Describe someone.", temperature=1.0,
                                       max_output_tokens=200, text={"format": {"type": "json_schema", "name": "person",
                                                                               "schema": PERSON, "strict": True}})
    jsonschema.validate(json.loads(response.output_text), PERSON)
    flat = {"type": "function", **WEATHER["function"]}
    called = client.responses.create(model=TINY_MODEL, input="Weather?", tools=[flat], tool_choice="required",
                                     temperature=1.0, max_output_tokens=80)
    [call] = [item for item in called.output if item.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), WEATHER["function"]["parameters"])


@pytest.mark.parametrize("num_beams, n", [(4, 1), (3, 2)])
def test_beam_search_equals_generate(client, reference, num_beams, n):
    prompt = "The little dog"
    answer = client.completions.create(model=TINY_MODEL, prompt=prompt, max_tokens=12, n=n,
                                       extra_body={"num_beams": num_beams, "length_penalty": 0.8,
                                                   "return_token_ids": True})
    ids = reference.encode(prompt)
    import torch

    with torch.no_grad():
        expected = reference.model.generate(
            torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), max_new_tokens=12,
            do_sample=False, num_beams=num_beams, num_return_sequences=n, length_penalty=0.8,
            pad_token_id=reference.tokenizer.pad_token_id)[:, len(ids):].tolist()
    eos = reference.tokenizer.eos_token_id
    expected = [reference.decode(row[: row.index(eos)] if eos in row else row) for row in expected]
    assert [choice.text for choice in sorted(answer.choices, key=lambda c: c.index)] == expected


def test_hugging_face_extras_through_the_sdk(client, reference):
    prompt = "Once upon a time"
    free = client.completions.create(model=TINY_MODEL, prompt=prompt, max_tokens=8, temperature=0).choices[0].text
    word = free.split()[0]
    banned = client.completions.create(model=TINY_MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                       extra_body={"bad_words": [word]}).choices[0].text
    ids = reference.encode(prompt)
    bad = [reference.tokenizer(w, add_special_tokens=False)["input_ids"] for w in (word, " " + word)]
    assert banned == reference.decode(reference.greedy(ids, 8, bad_words_ids=bad))
    long = client.completions.create(model=TINY_MODEL, prompt=prompt, max_tokens=30, temperature=0,
                                     extra_body={"min_length": len(ids) + 25, "typical_p": 0.9})
    assert long.choices[0].text == reference.decode(reference.greedy(ids, 30, min_length=len(ids) + 25))


DEEP = {"type": "object", "properties": {"a": {}}}
node = DEEP["properties"]["a"]
for _ in range(18):  # 36+ levels: over our schema limit (32), under the body limit (64)
    node["type"], node["properties"] = "object", {"a": {}}
    node = node["properties"]["a"]


@pytest.mark.parametrize("body, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {"type": "string"}}}}},
     "response_format", "not"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "string", "pattern": "(?<=a)b"}}}}, "response_format", "look-around"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": DEEP}}},
     "response_format.json_schema.schema", "deeper than"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "enum": ["x" * 1000] * 80}}}}, "response_format.json_schema.schema", "bytes"),
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs", "unclosed"),
    ({"structured_outputs": {"grammar": 'start: "a" | missing'}}, "structured_outputs", "missing"),
    ({"structured_outputs": {"json": {"type": "object"}, "regex": "a"}}, "structured_outputs", "exactly one"),
    ({"structured_outputs": {"xml": "a"}}, "structured_outputs", "xml"),
    ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}, "structured_outputs",
     "cannot both"),
    ({"num_beams": 2, "n": 3}, "n", "num_beams"),
    ({"num_beams": 2, "logprobs": True}, "num_beams", "logprobs"),
    ({"bad_words_ids": [[]]}, "bad_words_ids", "token ids"),
    ({"bad_words_ids": [[10**6]]}, "bad_words_ids", "vocabulary"),
    ({"early_stopping": "sometimes"}, "early_stopping", "never"),
])
def test_bad_structured_requests_are_400_naming_the_part(server, body, param, words):
    response = httpx.post(f"{server.base_url}/v1/chat/completions", headers=server.headers, timeout=60,
                          json={"model": TINY_MODEL, "messages": USER, "max_tokens": 5, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error
