"""/v1/responses through real servers and the real OpenAI SDK; the thinking server uses a custom template."""
from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest
from openai import OpenAI

from .parse_whole import parse_text

from .conftest import TINY_MODEL
from .helpers.errors import assert_openai_error

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALL_PREFILL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'


def tokenize(server, **body) -> dict:
    response = httpx.post(f"{server.base_url}/tokenize", json={"model": TINY_MODEL, **body}, headers=server.headers,
                          timeout=60)
    return response.json()


def sdk(server) -> OpenAI:
    return OpenAI(base_url=f"{server.base_url}/v1", api_key=server.key, max_retries=0, timeout=120)


def test_text_response_matches_chat_and_counts_instructions(server, client):
    result = client.responses.create(model=TINY_MODEL, input="Tell me a story.", instructions="Be brief.",
                                     max_output_tokens=12, temperature=0)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story."}]
    chat = client.chat.completions.create(model=TINY_MODEL, messages=messages, max_tokens=12, temperature=0)
    assert result.object == "response" and result.id.startswith("resp_")
    assert result.output_text == (chat.choices[0].message.content or "")
    assert result.usage.input_tokens == tokenize(server, messages=messages)["count"]
    assert result.usage.output_tokens == 12
    assert result.status == "incomplete" and result.incomplete_details.reason == "max_output_tokens"
    assert result.output[-1].type == "message" and result.output[-1].role == "assistant"


EVENT_ORDER = re.compile(
    r"response\.created response\.in_progress "
    r"((response\.output_item\.added response\.content_part\.added "
    r"(response\.(output_text|reasoning_text)\.delta )*response\.(output_text|reasoning_text)\.done "
    r"response\.content_part\.done response\.output_item\.done )"
    r"|(response\.output_item\.added response\.function_call_arguments\.delta "
    r"response\.function_call_arguments\.done response\.output_item\.done ))+"
    r"response\.(completed|incomplete)$")


def check_event_order(events) -> None:
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert EVENT_ORDER.match(" ".join(e.type for e in events)), [e.type for e in events]


def test_streamed_events_follow_openai_order_and_rebuild_the_answer(client):
    whole = client.responses.create(model=TINY_MODEL, input="Hello", max_output_tokens=10, temperature=0)
    events = list(client.responses.create(model=TINY_MODEL, input="Hello", max_output_tokens=10, temperature=0,
                                          stream=True))
    check_event_order(events)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    assert events[-1].response.output_text == whole.output_text
    assert events[-1].response.usage.output_tokens == 10


def test_a_stream_echoes_a_tool_schema_with_an_integer_past_64_bits(server):
    """The events carry the request's tools as sent, whatever JSON they hold (orjson refuses integers past
    64 bits: those frames are written by json instead)."""
    tool = {"type": "function", "name": "count", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "maximum": 10 ** 30}}}}
    body = {"model": TINY_MODEL, "input": "Count", "tools": [tool], "tool_choice": "none", "max_output_tokens": 3,
            "stream": True}
    with httpx.stream("POST", f"{server.base_url}/v1/responses", json=body, headers=server.headers,
                      timeout=60) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    assert response.status_code == 200
    assert events[-1]["type"] == "response.incomplete", events[-1]  # its 3 tokens ran out
    assert events[0]["response"]["tools"][0]["parameters"]["properties"]["n"]["maximum"] == 10 ** 30


def test_async_streaming(async_client):
    async def run():
        stream = await async_client.responses.create(model=TINY_MODEL, input="Hi", max_output_tokens=5, stream=True)
        return [event async for event in stream]

    check_event_order(asyncio.run(run()))


def test_function_call_items_round_trip_as_tool_turns(server, client):
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "22 C"}]
    result = client.responses.create(model=TINY_MODEL, input=items, tools=[WEATHER], max_output_tokens=2)
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "22 C"}]
    chat_tool = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    assert result.usage.input_tokens == tokenize(server, messages=messages, tools=[chat_tool])["count"]


def test_thinking_server_gives_reasoning_items_like_the_reference(thinking_server, thinking_template, reference):
    client = sdk(thinking_server)
    messages = [{"role": "user", "content": "Why is the sky blue?"}]
    prompt_ids = reference.tokenizer.apply_chat_template(
        messages, chat_template=thinking_template.read_text(), enable_thinking=True, add_generation_prompt=True,
        tokenize=True, return_dict=False)
    assert tokenize(thinking_server, messages=messages)["tokens"] == prompt_ids
    generated = reference.decode(reference.greedy(prompt_ids, 10))
    reasoning, content, _ = parse_text("<think>\n" + generated)
    assert reasoning  # the sample starts inside <think>

    result = client.responses.create(model=TINY_MODEL, input=messages[0]["content"], max_output_tokens=10, temperature=0)
    assert result.output[0].type == "reasoning"
    assert result.output[0].content[0].text == reasoning
    assert result.output_text == content
    events = list(client.responses.create(model=TINY_MODEL, input=messages[0]["content"], max_output_tokens=10,
                                          temperature=0, stream=True))
    check_event_order(events)
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == reasoning

    chat = client.chat.completions.create(model=TINY_MODEL, messages=messages, max_tokens=10, temperature=0)
    assert chat.choices[0].message.model_extra["reasoning_content"] == reasoning
    chunks = list(client.chat.completions.create(model=TINY_MODEL, messages=messages, max_tokens=10, temperature=0,
                                                 stream=True))
    kinds = [("reasoning" if c.choices[0].delta.model_extra.get("reasoning_content") else "content")
             for c in chunks if c.choices and (c.choices[0].delta.content or c.choices[0].delta.model_extra.get("reasoning_content"))]
    assert kinds == sorted(kinds, key=lambda kind: kind != "reasoning")  # reasoning deltas come first


def test_forced_function_call_becomes_a_function_call_item(thinking_server, reference):
    client = sdk(thinking_server)
    body = dict(model=TINY_MODEL, input="Weather in Paris?", tools=[WEATHER], temperature=0, max_output_tokens=3,
                extra_body={"chat_template_kwargs": {"assistant_prefill": CALL_PREFILL}, "stop": ["</tool_call>"],
                            "logit_bias": {str(reference.tokenizer.convert_tokens_to_ids("</tool_call>")): 100}})
    result = client.responses.create(**body)
    assert result.status == "completed"
    [call] = [item for item in result.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_")
    events = list(client.responses.create(stream=True, **body))
    check_event_order(events)
    assert "response.function_call_arguments.done" in [e.type for e in events]
    assert events[-1].type == "response.completed"


def post(server, body):
    return httpx.post(f"{server.base_url}/v1/responses", json=body, headers=server.headers, timeout=60)


@pytest.mark.parametrize("body,param", [
    ({"model": TINY_MODEL}, "input"),
    ({"model": TINY_MODEL, "input": []}, "input"),
    ({"model": TINY_MODEL, "input": "hi", "bogus": True}, "bogus"),
    ({"model": TINY_MODEL, "input": [{"type": "computer_call"}]}, "input[0].type"),
    ({"model": TINY_MODEL, "input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
    ({"model": TINY_MODEL, "input": [{"type": "function_call", "name": "f"}]}, "input[0]"),
    ({"model": TINY_MODEL, "input": "hi", "tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"model": TINY_MODEL, "input": "hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "x"}},
     "tool_choice"),
    ({"model": TINY_MODEL, "input": "hi", "tool_choice": "required"}, "tool_choice"),
    ({"model": TINY_MODEL, "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"model": TINY_MODEL, "input": "hi", "text": {"format": {"type": "yaml"}}}, "text.format"),
])
def test_bad_responses_requests_get_openai_400s(server, body, param):
    assert_openai_error(post(server, body), 400, param=param)


PIXEL = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQ"
         "AAAABJRU5ErkJggg==")


@pytest.mark.parametrize("image,param", [
    ("ftp://example.com/cat.png", "input[1].content[1]"),  # refused by the web side's checks
    (PIXEL, "input[1].content[1]"),  # refused by the worker (a text-only model): it names chat messages
])
def test_responses_errors_name_the_responses_fields(warm_server, image, param):
    """With instructions first, input[1] is the third chat message: the error still names input[1]."""
    body = {"model": TINY_MODEL, "instructions": "Be brief.", "max_output_tokens": 2, "input": [
        {"role": "user", "content": "hi"},
        {"role": "user", "content": [{"type": "input_text", "text": "what is it?"},
                                     {"type": "input_image", "image_url": image}]}]}
    response = post(warm_server, body)
    error = assert_openai_error(response, 400)
    assert error["param"].startswith(param), error
    assert "messages[" not in error["message"], error
