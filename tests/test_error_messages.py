"""Errors and log lines that say what happened (issue 49): a chat request to a speech model is refused
before anything is loaded, a refused CORS preflight is logged as one, and torch's and torchao's start-up
warnings stay out of the log."""
from __future__ import annotations

import re

import httpx
import openai
import pytest

from tests.conftest import TINY_MODEL, TINY_WHISPER
from tests.live_server import LiveServer, base_env
from workers.tiny.builders import build_tiny_model
from workers.tiny.multimodal import build_tiny_whisper

ALLOWED, REFUSED = "http://allowed.example", "http://refused.example"


@pytest.fixture(scope="module")
def speech_server(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hf-speech-cache")
    build_tiny_model(TINY_MODEL, size="tiny", cache_dir=cache)
    build_tiny_whisper(TINY_WHISPER, cache_dir=cache)
    work_dir = tmp_path_factory.mktemp("speech-server")
    live = LiveServer(base_env(cache, work_dir), work_dir, name="speech", extra_args=("--cors-allow-origins", ALLOWED))
    yield live
    live.stop()


def sdk(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.key, max_retries=0, timeout=120)


def status_of(server: LiveServer, model: str) -> str | None:
    listed = httpx.get(f"{server.base_url}/v1/models", headers=server.headers, timeout=30).json()["data"]
    return {m["id"]: m for m in listed}[model].get("status")


def test_a_chat_request_to_a_speech_model_is_refused_before_it_loads(speech_server):
    with pytest.raises(openai.BadRequestError) as refused:
        sdk(speech_server).chat.completions.create(model=TINY_WHISPER, max_tokens=4,
                                                   messages=[{"role": "user", "content": "Hello"}])
    assert refused.value.code == "unsupported_model" and refused.value.param == "model"
    assert "/v1/audio/transcriptions" in refused.value.message
    with pytest.raises(openai.BadRequestError):
        sdk(speech_server).completions.create(model=TINY_WHISPER, prompt="Hello", max_tokens=4)
    assert status_of(speech_server, TINY_WHISPER) != "loaded"
    assert f"loading {TINY_WHISPER}" not in speech_server.log().lower()


def preflight(server: LiveServer, origin: str) -> httpx.Response:
    return httpx.options(f"{server.base_url}/v1/chat/completions", timeout=30, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"})


def test_a_refused_preflight_is_logged_as_such(speech_server):
    assert preflight(speech_server, ALLOWED).headers.get("access-control-allow-origin") == ALLOWED
    refused = preflight(speech_server, REFUSED)
    assert "access-control-allow-origin" not in refused.headers
    speech_server.wait_for_log(f"CORS preflight from origin {REFUSED} refused", timeout=10)
    assert f"CORS preflight from origin {ALLOWED}" not in speech_server.log()


def test_torch_start_up_warnings_stay_out_of_the_log(speech_server):
    reply = sdk(speech_server).completions.create(model=TINY_MODEL, prompt="Once upon a time", max_tokens=2)
    assert reply.usage.completion_tokens == 2  # the model loaded: transformers (and torchao with it) imported
    log = speech_server.log()
    assert "register_constant" not in log and "Failed to load" not in log, log[-3000:]


def test_a_context_error_counts_tools_and_system_prompt_apart(speech_server):
    tools = [{"type": "function", "function": {
        "name": f"tool_{i}", "description": "Looks things up in a large catalogue of records " * 6,
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}} for i in range(30)]
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]

    def tokens(**body) -> int:
        response = httpx.post(f"{speech_server.base_url}/tokenize", headers=speech_server.headers, timeout=60,
                              json={"model": TINY_MODEL, "messages": messages, **body})
        assert response.status_code == 200, response.text
        return response.json()["count"]

    without_tools = tokens()  # fits: the messages and system prompt alone (the tools do not: /tokenize refuses)
    with pytest.raises(openai.BadRequestError) as refused:
        sdk(speech_server).chat.completions.create(model=TINY_MODEL, messages=messages, tools=tools, max_tokens=4)
    message = refused.value.message
    assert refused.value.code == "context_length_exceeded"
    assert "alone is" not in message, message
    found = re.search(r"is ([\d,]+) tokens \((.*?), with the template's own tokens\)", message)
    assert found, message
    split = {name: int(count.replace(",", "")) for name, count in
             (re.fullmatch(r"the (messages|system prompt|\d+ tools) ([\d,]+)", part).groups()
              for part in found.group(2).split(", "))}
    total = int(found.group(1).replace(",", ""))
    assert split["messages"] + split["system prompt"] == without_tools, message
    assert split[f"{len(tools)} tools"] == total - without_tools > split["messages"], message
    assert max(split.values()) == split[f"{len(tools)} tools"] and message.index("tools") < message.index("messages")
