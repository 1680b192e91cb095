"""/v1/chat/completions through a real server, the real OpenAI SDK and the tiny model's own chat template."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from .parse_whole import parse_text

from .conftest import TINY_MODEL
from .helpers.errors import assert_openai_error

CONVERSATIONS = [
    [{"role": "user", "content": "Hello there"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."},
     {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another one?"}],
]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def chat(client, **kwargs):
    kwargs.setdefault("model", TINY_MODEL)
    return client.chat.completions.create(**kwargs)


def rendered(reference, messages, **kwargs) -> list[int]:
    kwargs.setdefault("add_generation_prompt", True)
    return reference.tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)


def token_id(reference, token: str) -> int:
    return reference.tokenizer.convert_tokens_to_ids(token)


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_greedy_chat_equals_template_plus_generate_token_for_token(client, reference, messages):
    prompt_ids = rendered(reference, messages)
    expected = reference.greedy(prompt_ids, 20)
    result = chat(client, messages=messages, max_tokens=20, temperature=0, extra_body={"return_token_ids": True})
    choice = result.choices[0]
    assert result.model_extra["prompt_token_ids"] == prompt_ids
    assert choice.model_extra["token_ids"] == expected
    reasoning, content, _ = parse_text(reference.decode(expected))
    assert choice.message.content == content
    assert (choice.message.model_extra.get("reasoning_content") or "") == reasoning
    assert result.object == "chat.completion" and result.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    assert result.usage.prompt_tokens == len(prompt_ids) and result.usage.completion_tokens == 20


def test_developer_role_and_text_parts_render_as_system_and_joined_text(client, reference):
    messages = [{"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}]
    as_plain = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "one\ntwo"}]
    result = chat(client, messages=messages, max_tokens=1, extra_body={"return_token_ids": True})
    assert result.model_extra["prompt_token_ids"] == rendered(reference, as_plain)


def test_streaming_matches_non_streaming_and_starts_with_the_role(client):
    messages = CONVERSATIONS[1]
    whole = chat(client, messages=messages, max_tokens=16, temperature=0)
    chunks = list(chat(client, messages=messages, max_tokens=16, temperature=0, stream=True,
                       stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks if c.choices)
    assert text == (whole.choices[0].message.content or "")
    assert reasoning == (whole.choices[0].message.model_extra.get("reasoning_content") or "")
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_async_client_streams_and_completes(async_client):
    async def run():
        whole = await async_client.chat.completions.create(
            model=TINY_MODEL, messages=CONVERSATIONS[0], max_tokens=8, temperature=0)
        stream = await async_client.chat.completions.create(
            model=TINY_MODEL, messages=CONVERSATIONS[0], max_tokens=8, temperature=0, stream=True)
        parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        return whole, "".join(parts)

    whole, streamed = asyncio.run(run())
    assert streamed == whole.choices[0].message.content


def test_raw_prompt_mode_matches_the_completions_endpoint(server, client):
    body = {"model": TINY_MODEL, "prompt": "Once upon a time", "max_tokens": 10, "temperature": 0}
    via_chat = post(server, body).json()
    via_completions = client.completions.create(**body)
    assert via_chat["choices"][0]["message"]["content"] == via_completions.choices[0].text
    assert via_chat["usage"]["prompt_tokens"] == via_completions.usage.prompt_tokens


def test_sampling_parameters_n_seed_stop_and_max_completion_tokens(client):
    a = chat(client, messages=CONVERSATIONS[0], n=3, seed=7, temperature=1.0, max_completion_tokens=12,
             extra_body={"top_k": 50, "min_p": 0.01, "repetition_penalty": 1.1})
    b = chat(client, messages=CONVERSATIONS[0], n=3, seed=7, temperature=1.0, max_completion_tokens=12,
             extra_body={"top_k": 50, "min_p": 0.01, "repetition_penalty": 1.1})
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert a.usage.completion_tokens == 36
    greedy = chat(client, messages=CONVERSATIONS[0], max_tokens=20, temperature=0).choices[0].message.content
    stop = greedy.strip()[3:6]
    stopped = chat(client, messages=CONVERSATIONS[0], max_tokens=20, temperature=0, stop=[stop]).choices[0]
    assert stop not in stopped.message.content and stopped.finish_reason == "stop"


def test_default_max_tokens_is_the_rest_of_the_context(server, client):
    result = chat(client, messages=CONVERSATIONS[0], temperature=0, extra_body={"ignore_eos": True})
    tokenized = httpx.post(f"{server.base_url}/tokenize", headers=server.headers, timeout=60,
                           json={"model": TINY_MODEL, "messages": CONVERSATIONS[0]}).json()
    assert result.usage.prompt_tokens == tokenized["count"]
    assert result.usage.total_tokens == tokenized["max_model_len"]
    assert result.choices[0].finish_reason == "length"


def test_logprobs_have_the_chat_shape(client, reference):
    result = chat(client, messages=CONVERSATIONS[0], max_tokens=6, temperature=0, logprobs=True, top_logprobs=3,
                  extra_body={"return_token_ids": True})
    choice = result.choices[0]
    content = choice.logprobs.content
    assert len(content) == 6
    for entry, token in zip(content, choice.model_extra["token_ids"]):
        assert entry.token == reference.tokenizer.decode([token])
        assert entry.bytes == list(entry.token.encode())
        assert 1 <= len(entry.top_logprobs) <= 3
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-6  # greedy: the chosen token is the best
    no_logprobs = chat(client, messages=CONVERSATIONS[0], max_tokens=2)
    assert no_logprobs.choices[0].logprobs is None


def test_continued_thinking_prefill_yields_reasoning_content(client, reference):
    """A prefilled `<think>` turn: the generation is reasoning until the model closes it."""
    messages = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "<think>\nLet me see"}]
    prompt_ids = rendered(reference, messages, add_generation_prompt=False, continue_final_message=True)
    expected = reference.decode(reference.greedy(prompt_ids, 12))
    result = chat(client, messages=messages, max_tokens=12, temperature=0,
                  extra_body={"continue_final_message": True, "add_generation_prompt": False})
    reasoning, content, _ = parse_text("<think>\nLet me see" + expected)
    message = result.choices[0].message
    assert message.model_extra.get("reasoning_content") == reasoning.removeprefix("Let me see")
    assert (message.content or "") == content
    closed = chat(client, messages=messages, max_tokens=3, temperature=0,
                  logit_bias={str(token_id(reference, "</think>")): 100}, extra_body={"continue_final_message": True})
    assert closed.choices[0].message.model_extra.get("reasoning_content") is None
    assert closed.choices[0].message.content == "</think></think>"  # the first closes, the rest is text


def test_forced_tool_call_is_parsed_streamed_and_round_trips(client, reference):
    prefill = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    messages = [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": prefill}]
    body = dict(messages=messages, tools=[WEATHER_TOOL], temperature=0, max_tokens=1,
                logit_bias={str(token_id(reference, "</tool_call>")): 100}, extra_body={"continue_final_message": True})
    result = chat(client, **body)
    choice = result.choices[0]
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    stopped = chat(client, **{**body, "max_tokens": 4, "stop": ["</tool_call>"]})
    assert stopped.choices[0].finish_reason == "tool_calls"

    chunks = list(chat(client, stream=True, **body))
    streamed = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert (streamed[0].index, streamed[0].id is not None, streamed[0].function.name) == (0, True, "get_weather")
    assert json.loads("".join(tc.function.arguments or "" for tc in streamed)) == {"city": "Paris"}

    follow_up = [{"role": "user", "content": "Weather in Paris?"},
                 {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "22 C"}]
    answer = chat(client, messages=follow_up, tools=[WEATHER_TOOL], max_tokens=4, extra_body={"return_token_ids": True})
    as_template = [follow_up[0], {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        follow_up[2]]
    assert answer.model_extra["prompt_token_ids"] == rendered(reference, as_template, tools=[WEATHER_TOOL])


def test_template_kwargs_reach_the_template(client, reference):
    result = chat(client, messages=CONVERSATIONS[0], max_tokens=1,
                  extra_body={"chat_template_kwargs": {"enable_thinking": False}, "return_token_ids": True})
    assert result.model_extra["prompt_token_ids"] == rendered(reference, CONVERSATIONS[0], enable_thinking=False)
    assert token_id(reference, "</think>") in result.model_extra["prompt_token_ids"]


def test_response_format_is_validated_and_accepted(client):
    result = chat(client, messages=CONVERSATIONS[0], max_tokens=2, response_format={"type": "json_object"})
    assert result.choices[0].message.role == "assistant"


def test_huggingface_inference_client_talks_to_the_server(server):
    from huggingface_hub import InferenceClient

    hf = InferenceClient(base_url=f"{server.base_url}/v1", api_key=server.key)
    result = hf.chat_completion(messages=CONVERSATIONS[0], model=TINY_MODEL, max_tokens=5, temperature=0)
    assert result.choices[0].message.role == "assistant"
    assert result.usage.completion_tokens == 5
    streamed = "".join(c.choices[0].delta.content or "" for c in hf.chat_completion(
        messages=CONVERSATIONS[0], model=TINY_MODEL, max_tokens=5, temperature=0, stream=True) if c.choices)
    assert streamed == (result.choices[0].message.content or "")


def post(server, body):
    return httpx.post(f"{server.base_url}/v1/chat/completions", json=body, headers=server.headers, timeout=60)


USER = [{"role": "user", "content": "hi"}]
BAD_BODIES = [
    ({"model": TINY_MODEL, "messages": []}, "messages"),
    ({"model": TINY_MODEL}, "messages"),
    ({"model": TINY_MODEL, "messages": USER, "prompt": "hi"}, "messages"),
    ({"model": TINY_MODEL, "messages": "hi"}, "messages"),
    # A custom role ("robot") goes to the template and an unknown field is ignored (issue 49, vLLM's way):
    # a role that is not a name is still refused (tests/test_lenient_messages.py has the accepted shapes).
    ({"model": TINY_MODEL, "messages": [{"role": "robot arm!", "content": "x"}]}, "messages[0].role"),
    ({"model": TINY_MODEL, "messages": [{"role": "user"}]}, "messages[0].content"),
    ({"model": TINY_MODEL, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"model": TINY_MODEL, "messages": [{"role": "user", "content": "x", "tool_calls": [{"id": "c"}]}]},
     "messages[0].tool_calls"),
    ({"model": TINY_MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0].image_url"),
    ({"model": TINY_MODEL, "messages": USER, "tool_choice": "required"}, "tool_choice"),
    ({"model": TINY_MODEL, "messages": USER, "tools": [WEATHER_TOOL],
      "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"model": TINY_MODEL, "messages": USER, "tools": [{"type": "function"}]}, "tools[0]"),
    ({"model": TINY_MODEL, "messages": USER, "top_logprobs": 2}, "top_logprobs"),
    ({"model": TINY_MODEL, "messages": USER, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"model": TINY_MODEL, "messages": USER, "response_format": {"type": "yaml"}}, "response_format"),
    ({"model": TINY_MODEL, "messages": USER, "chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs"),
    ({"model": TINY_MODEL, "messages": USER, "continue_final_message": True}, "continue_final_message"),
    ({"model": TINY_MODEL, "messages": USER, "surprise": 1}, "surprise"),
    ({"model": TINY_MODEL, "messages": USER, "temperature": 3}, "temperature"),
    ({"model": TINY_MODEL, "messages": USER, "stream_options": {"include_usage": True}}, "stream_options"),
]


@pytest.mark.parametrize("body,param", BAD_BODIES)
def test_bad_chat_requests_get_openai_400s(server, body, param):
    assert_openai_error(post(server, body), 400, param=param)


def test_over_long_chat_and_unknown_model_are_4xx(server):
    assert_openai_error(post(server, {"model": TINY_MODEL, "messages": USER, "max_tokens": 10_000}), 400,
                        code="context_length_exceeded")
    assert_openai_error(post(server, {"model": "nobody/nothing", "messages": USER}), 404)
