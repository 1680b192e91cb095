"""Every request parameter the installed `openai` SDK declares is accepted, and each honoured one has its effect.

Through the real server and SDK (or plain HTTP for vLLM's extras), against the tiny model and its reference.
"""
from __future__ import annotations

import json
import sqlite3
import time
import typing

import httpx
import pytest
from openai.types import completion_create_params as legacy_params
from openai.types.chat import completion_create_params as chat_params
from openai.types.responses import response_create_params

from .conftest import TINY_MODEL
from .helpers.errors import assert_openai_error

SDK_PARAMS = [
    (chat_params.CompletionCreateParamsBase, "openai_api.serializers.chat.ChatRequestSerializer"),
    (legacy_params.CompletionCreateParamsBase, "openai_api.serializers.completions.CompletionRequestSerializer"),
    (response_create_params.ResponseCreateParamsBase,
     "openai_api.serializers.responses.ResponsesRequestSerializer"),
]
MESSAGES = [{"role": "user", "content": "Tell me a story."}]


def serializer_fields(dotted: str) -> set[str]:
    from importlib import import_module

    module, name = dotted.rsplit(".", 1)
    return set(getattr(import_module(module), name)().fields)


@pytest.mark.parametrize("params,serializer", SDK_PARAMS, ids=["chat", "completions", "responses"])
def test_every_parameter_the_sdk_declares_is_a_field(params, serializer):
    """A parameter a new SDK adds fails here the day it appears (then: honour it, or accept and document it)."""
    declared = set(typing.get_type_hints(params))
    assert declared, "the SDK's typed parameters could not be read"
    missing = declared - serializer_fields(serializer)
    assert not missing, f"the openai SDK sends {sorted(missing)}, which {serializer} does not accept"


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json={"model": TINY_MODEL, **body}, headers=server.headers,
                      timeout=120)


def test_chat_accepts_openai_parameters_through_the_sdk(warm_server, client):
    result = client.chat.completions.create(
        model=TINY_MODEL, messages=MESSAGES, max_completion_tokens=5, store=True, metadata={"run": "r1"},
        service_tier="flex", reasoning_effort="low", verbosity="low", modalities=["text"],
        prompt_cache_key="shared-prefix", safety_identifier="user-hash", user="alice",
        prediction={"type": "content", "content": "Once"}, temperature=0)
    assert result.usage.completion_tokens == 5


def test_metadata_user_and_safety_identifier_reach_the_usage_record(warm_server, client):
    marker = f"m{time.time_ns()}"
    result = client.chat.completions.create(model=TINY_MODEL, messages=MESSAGES, max_tokens=2,
                                            metadata={"marker": marker}, user="bob", safety_identifier="sid-1",
                                            service_tier="flex")
    database = warm_server.work_dir / "var" / "db.sqlite3"
    for _ in range(50):  # the ledger is written in batches, off the request path
        with sqlite3.connect(database) as connection:
            rows = connection.execute("SELECT tags FROM teams_usagerecord WHERE request_id = ?", (result.id,)).fetchall()
        if rows:
            break
        time.sleep(0.2)
    assert rows, "no usage row for the request"
    tags = json.loads(rows[0][0])
    assert tags == {"metadata": {"marker": marker}, "user": "bob", "safety_identifier": "sid-1", "service_tier": "flex"}


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"messages": MESSAGES, "tool_choice": "auto"}, "tool_choice"),
    ("/v1/chat/completions", {"messages": MESSAGES, "modalities": ["text", "audio"]}, "modalities"),
    ("/v1/chat/completions", {"messages": MESSAGES, "reasoning_effort": "extreme"}, "reasoning_effort"),
    ("/v1/chat/completions", {"messages": MESSAGES, "service_tier": "gold"}, "service_tier"),
    ("/v1/chat/completions", {"messages": MESSAGES, "metadata": {"k": 1}}, "metadata"),
    ("/v1/chat/completions", {"messages": MESSAGES, "reasoning_efort": "low"}, "reasoning_efort"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ("/v1/completions", {"prompt": "hi", "stop_token_ids": [-1]}, "stop_token_ids"),
    ("/v1/completions", {"prompt": "hi", "allowed_token_ids": [10**9]}, "allowed_token_ids"),
    ("/v1/responses", {"input": "hi", "truncation": "sometimes"}, "truncation"),
    ("/v1/responses", {"input": "hi", "include": ["everything"]}, "include"),
    ("/v1/responses", {"input": "hi", "background": True, "store": False}, "background"),
    ("/v1/responses", {"input": "hi", "reasoning": {"effort": "low", "depth": 3}}, "reasoning.depth"),
])
def test_bad_values_and_unknown_names_are_openai_400s(warm_server, path, body, param):
    assert_openai_error(post(warm_server, path, body), 400, param=param)


def test_reasoning_effort_switches_the_templates_thinking(thinking_server):
    """The thinking server opens <think> by default; reasoning_effort "none" turns the template's switch off."""
    def prompt_ids(**extra) -> list[int]:
        body = post(thinking_server, "/v1/chat/completions",
                    {"messages": MESSAGES, "max_tokens": 1, "return_token_ids": True, **extra}).json()
        return body["prompt_token_ids"]

    rendered_on = httpx.post(f"{thinking_server.base_url}/tokenize", headers=thinking_server.headers, timeout=60,
                             json={"model": TINY_MODEL, "messages": MESSAGES,
                                   "chat_template_kwargs": {"enable_thinking": True}}).json()["tokens"]
    rendered_off = httpx.post(f"{thinking_server.base_url}/tokenize", headers=thinking_server.headers, timeout=60,
                              json={"model": TINY_MODEL, "messages": MESSAGES,
                                    "chat_template_kwargs": {"enable_thinking": False}}).json()["tokens"]
    assert rendered_on != rendered_off
    assert prompt_ids(reasoning_effort="none") == rendered_off
    assert prompt_ids(reasoning_effort="high") == rendered_on


def test_stop_token_ids_stop_there_and_keep_the_token_only_when_asked(warm_server, reference):
    prompt = "Once upon a time"
    expected = reference.greedy(reference.encode(prompt), 12)
    stop_id = expected[4]
    first = expected.index(stop_id)
    body = post(warm_server, "/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0,
                                                 "stop_token_ids": [stop_id], "return_token_ids": True}).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["token_ids"] == expected[:first + 1]
    assert choice["text"] == reference.decode(expected[:first])
    kept = post(warm_server, "/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0,
                                                 "stop_token_ids": [stop_id], "include_stop_str_in_output": True}).json()
    assert kept["choices"][0]["text"] == reference.decode(expected[:first + 1])


def test_include_stop_str_in_output_keeps_the_stop_string(warm_server, reference):
    prompt = "Once upon a time"
    text = reference.decode(reference.greedy(reference.encode(prompt), 16))
    stop = text.strip()[3:6]
    assert stop and stop in text
    cut = post(warm_server, "/v1/completions", {"prompt": prompt, "max_tokens": 16, "temperature": 0, "stop": [stop]})
    kept = post(warm_server, "/v1/completions", {"prompt": prompt, "max_tokens": 16, "temperature": 0, "stop": [stop],
                                                 "include_stop_str_in_output": True})
    assert cut.json()["choices"][0]["text"] == text[:text.index(stop)]
    assert kept.json()["choices"][0]["text"] == text[:text.index(stop) + len(stop)]


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "Once upon a time there was a little dragon who lived"}),
    ("/v1/chat/completions", {"messages": MESSAGES}),
])
def test_truncate_prompt_tokens_keeps_the_last_n(warm_server, path, body):
    result = post(warm_server, path, {**body, "max_tokens": 1, "truncate_prompt_tokens": 5, "return_token_ids": True})
    assert result.status_code == 200, result.text
    assert result.json()["usage"]["prompt_tokens"] == 5


def test_every_token_is_in_allowed_token_ids(warm_server, reference):
    allowed = reference.encode(" the cat sat on a mat")[1:]
    body = post(warm_server, "/v1/completions", {"prompt": "Hello", "max_tokens": 20, "temperature": 1.0, "seed": 3,
                                                 "allowed_token_ids": allowed, "return_token_ids": True,
                                                 "ignore_eos": True}).json()
    ids = body["choices"][0]["token_ids"]
    assert len(ids) == 20 and set(ids) <= set(allowed)


def stream_events(server, path: str, body: dict) -> list[dict]:
    events = []
    with httpx.stream("POST", f"{server.base_url}{path}", json={"model": TINY_MODEL, **body}, headers=server.headers,
                      timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[len("data: "):]))
    return events


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "Once upon a time"}),
    ("/v1/chat/completions", {"messages": MESSAGES}),
])
def test_continuous_usage_stats_put_usage_in_every_chunk(warm_server, path, body):
    chunks = stream_events(warm_server, path, {**body, "max_tokens": 8, "stream": True, "ignore_eos": True,
                                               "stream_options": {"include_usage": True,
                                                                  "continuous_usage_stats": True}})
    assert chunks and all(chunk.get("usage") for chunk in chunks)
    completion = [chunk["usage"]["completion_tokens"] for chunk in chunks]
    assert completion == sorted(completion) and completion[-1] == 8
    assert len({chunk["usage"]["prompt_tokens"] for chunk in chunks}) == 1


def test_return_token_ids_as_vllm_places_them(warm_server, reference):
    prompts = ["Once upon a time", "The little dragon"]
    whole = post(warm_server, "/v1/completions", {"prompt": prompts, "max_tokens": 3, "n": 2, "return_token_ids": True})
    choices = whole.json()["choices"]
    assert "prompt_token_ids" not in whole.json()
    assert [c["prompt_token_ids"] for c in sorted(choices, key=lambda c: c["index"])] == \
        [reference.encode(prompts[0])] * 2 + [reference.encode(prompts[1])] * 2
    chunks = stream_events(warm_server, "/v1/completions", {"prompt": prompts[0], "max_tokens": 4, "stream": True,
                                                            "return_token_ids": True, "ignore_eos": True})
    with_ids = [chunk for chunk in chunks if "prompt_token_ids" in chunk["choices"][0]]
    assert len(with_ids) == 1 and with_ids[0] is chunks[0]
    assert with_ids[0]["choices"][0]["prompt_token_ids"] == reference.encode(prompts[0])


def test_prompt_logprobs_score_the_prompt_on_completions_and_chat(warm_server, reference):
    prompt = "Once upon a time"
    ids = reference.encode(prompt)
    choice = post(warm_server, "/v1/completions", {"prompt": prompt, "max_tokens": 1,
                                                   "prompt_logprobs": 2}).json()["choices"][0]
    scored = choice["prompt_logprobs"]
    assert len(scored) == len(ids) and scored[0] is None
    for token_id, entry in zip(ids[1:], scored[1:]):
        assert str(token_id) in entry and 2 <= len(entry) <= 3
        assert entry[str(token_id)]["logprob"] <= 0 and entry[str(token_id)]["rank"] >= 1
    chat = post(warm_server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1, "prompt_logprobs": 0,
                                                      "return_token_ids": True}).json()
    assert len(chat["prompt_logprobs"]) == len(chat["prompt_token_ids"])


def test_chat_echo_starts_with_the_final_assistant_message(warm_server):
    messages = [*MESSAGES, {"role": "assistant", "content": "Once upon"}]
    body = {"messages": messages, "max_tokens": 4, "temperature": 0, "continue_final_message": True,
            "add_generation_prompt": False}
    plain = post(warm_server, "/v1/chat/completions", body).json()["choices"][0]["message"]["content"]
    echoed = post(warm_server, "/v1/chat/completions", {**body, "echo": True}).json()["choices"][0]["message"]["content"]
    assert echoed == "Once upon" + plain


def test_return_tokens_as_token_ids_names_logprobs_tokens_by_id(warm_server):
    choice = post(warm_server, "/v1/completions", {"prompt": "Hello", "max_tokens": 3, "logprobs": 1,
                                                   "return_tokens_as_token_ids": True,
                                                   "return_token_ids": True}).json()["choices"][0]
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]


def test_use_beam_search_is_the_beam_search(warm_server, reference):
    prompt = "Once upon a time"
    expected = reference.greedy(reference.encode(prompt), 6, num_beams=2)
    body = post(warm_server, "/v1/completions", {"prompt": prompt, "max_tokens": 6, "n": 2, "use_beam_search": True,
                                                 "return_token_ids": True}).json()
    assert expected in [choice["token_ids"] for choice in body["choices"]]


def test_vllm_server_endpoints(warm_server):
    version = httpx.get(f"{warm_server.base_url}/version", headers=warm_server.headers).json()
    assert isinstance(version["version"], str) and version["version"]
    info = httpx.get(f"{warm_server.base_url}/tokenizer_info", params={"model": TINY_MODEL},
                     headers=warm_server.headers).json()
    assert info["model"] == TINY_MODEL and info["tokenizer_class"]
    models = httpx.get(f"{warm_server.base_url}/v1/models", headers=warm_server.headers).json()["data"]
    tiny = next(m for m in models if m["id"] == TINY_MODEL)
    tokenized = httpx.post(f"{warm_server.base_url}/tokenize", headers=warm_server.headers, timeout=60,
                           json={"model": TINY_MODEL, "prompt": "Hello there", "return_token_strs": True}).json()
    assert tiny["root"] == TINY_MODEL and tiny["max_model_len"] == tokenized["max_model_len"]
    assert len(tokenized["token_strs"]) == len(tokenized["tokens"])
    assert "".join(tokenized["token_strs"]).endswith("Hello there")
