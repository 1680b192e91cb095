"""Stateful Responses through the real openai SDK: store, previous_response_id, retrieve/delete/input_items,
background with polling and cancel (also across a restart of the web process), include logprobs, reasoning."""
from __future__ import annotations

import os
import signal
import time

import httpx
import openai
import pytest
from openai import OpenAI

from .conftest import TINY_MODEL
from .live_server import LiveServer, base_env
from .teams_setup import make_teams
from .helpers.errors import assert_openai_error


@pytest.fixture(scope="module")
def stored(hf_cache, tmp_path_factory):
    """A server, its key, and a key of another team."""
    work_dir = tmp_path_factory.mktemp("stored-responses")
    env = base_env(hf_cache, work_dir)
    live = LiveServer(env, work_dir, name="stored")
    live.secrets = make_teams(env, teams={"others": []}, keys={"other-key": ["--team", "others"]})
    yield live
    live.stop()


def sdk(server, key: str | None = None) -> OpenAI:
    return OpenAI(base_url=f"{server.base_url}/v1", api_key=key or server.key, max_retries=0, timeout=120)


def token_count(server, messages: list[dict], **kwargs) -> int:
    response = httpx.post(f"{server.base_url}/tokenize", headers=server.headers, timeout=60,
                          json={"model": TINY_MODEL, "messages": messages, **kwargs})
    return response.json()["count"]


def wait_for(client: OpenAI, response_id: str, statuses: tuple[str, ...], timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while True:
        response = client.responses.retrieve(response_id)
        if response.status in statuses or time.monotonic() > deadline:
            return response
        time.sleep(0.2)


def test_previous_response_id_continues_the_stored_conversation(stored):
    client = sdk(stored)
    first = client.responses.create(model=TINY_MODEL, input="My name is Ada.", max_output_tokens=4, temperature=0)
    assert first.store is True
    second = client.responses.create(model=TINY_MODEL, input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=4, temperature=0)
    assert second.previous_response_id == first.id
    history = [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": first.output_text},
               {"role": "user", "content": "What is my name?"}]
    assert second.usage.input_tokens == token_count(stored, history)  # the prior turns count as input
    # The same conversation sent whole gives the same answer.
    whole = client.responses.create(model=TINY_MODEL, input=history, max_output_tokens=4, temperature=0, store=False)
    assert whole.output_text == second.output_text

    again = client.responses.retrieve(second.id)
    assert again.id == second.id and again.output_text == second.output_text
    items = client.responses.input_items.list(second.id)
    assert [item.type for item in items.data] == ["message"]
    assert items.data[0].content[0].text == "What is my name?"


def test_store_false_keeps_nothing_and_delete_removes(stored):
    client = sdk(stored)
    unstored = client.responses.create(model=TINY_MODEL, input="Hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    kept = client.responses.create(model=TINY_MODEL, input="Hi", max_output_tokens=2)
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=TINY_MODEL, input="Hi", previous_response_id=kept.id, max_output_tokens=2)


def test_another_teams_key_finds_nothing(stored):
    mine = sdk(stored).responses.create(model=TINY_MODEL, input="Secret plans", max_output_tokens=2)
    other = sdk(stored, stored.secrets["other-key"])
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.create(model=TINY_MODEL, input="Go on", previous_response_id=mine.id, max_output_tokens=2)
    assert_openai_error(httpx.delete(f"{stored.base_url}/v1/responses/{mine.id}", timeout=30,
                                     headers={"Authorization": f"Bearer {stored.secrets['other-key']}"}), 404)
    assert sdk(stored).responses.retrieve(mine.id).id == mine.id


def test_background_runs_to_the_same_answer_while_the_client_polls(stored):
    client = sdk(stored)
    queued = client.responses.create(model=TINY_MODEL, input="Tell me a story.", max_output_tokens=8,
                                     temperature=0, background=True)
    assert queued.status == "queued" and queued.background is True
    done = wait_for(client, queued.id, ("completed", "incomplete", "failed"))
    assert done.status == "incomplete" and done.usage.output_tokens == 8
    foreground = client.responses.create(model=TINY_MODEL, input="Tell me a story.", max_output_tokens=8,
                                         temperature=0, store=False)
    assert done.output_text == foreground.output_text


def test_background_cancel_stops_it(stored):
    client = sdk(stored)
    limit = httpx.post(f"{stored.base_url}/tokenize", headers=stored.headers, timeout=60,
                       json={"model": TINY_MODEL, "prompt": "x"}).json()["max_model_len"]
    queued = client.responses.create(model=TINY_MODEL, input="Tell me a long story.", max_output_tokens=limit - 64,
                                     background=True, extra_body={"ignore_eos": True})
    wait_for(client, queued.id, ("in_progress",))
    cancelled = client.responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    time.sleep(1.5)
    assert client.responses.retrieve(queued.id).status == "cancelled"
    foreground = client.responses.create(model=TINY_MODEL, input="Hi", max_output_tokens=2, store=False)
    assert foreground.status == "incomplete"  # the worker is free again


def test_include_output_text_logprobs(stored):
    result = sdk(stored).responses.create(model=TINY_MODEL, input="Hello", max_output_tokens=6, temperature=0,
                                          include=["message.output_text.logprobs"], top_logprobs=3)
    part = result.output[-1].content[0]
    assert len(part.logprobs) == result.usage.output_tokens == 6
    assert all(len(entry.top_logprobs) == 3 and entry.logprob <= 0 for entry in part.logprobs)
    joined = b"".join(bytes(entry.bytes) for entry in part.logprobs)  # a token may be part of a character
    assert joined.decode("utf-8", errors="replace") == part.text


def test_reasoning_effort_switches_thinking_in_responses(thinking_server):
    client = sdk(thinking_server)
    messages = [{"role": "user", "content": "Hello"}]
    off = client.responses.create(model=TINY_MODEL, input="Hello", max_output_tokens=2, reasoning={"effort": "none"},
                                  store=False)
    on = client.responses.create(model=TINY_MODEL, input="Hello", max_output_tokens=2, reasoning={"effort": "high"},
                                 store=False)
    assert off.usage.input_tokens == token_count(thinking_server, messages,
                                                 chat_template_kwargs={"enable_thinking": False})
    assert on.usage.input_tokens == token_count(thinking_server, messages,
                                                chat_template_kwargs={"enable_thinking": True})
    assert off.usage.input_tokens != on.usage.input_tokens


def test_truncation_auto_drops_the_oldest_turns(stored):
    client = sdk(stored)
    limit = httpx.post(f"{stored.base_url}/tokenize", headers=stored.headers, timeout=60,
                       json={"model": TINY_MODEL, "prompt": "x"}).json()["max_model_len"]
    turn = "word " * (limit // 3)
    history = [{"role": "user" if i % 2 == 0 else "assistant", "content": turn} for i in range(5)]
    history.append({"role": "user", "content": "And now?"})
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=TINY_MODEL, input=history, max_output_tokens=4, store=False)
    fitted = client.responses.create(model=TINY_MODEL, input=history, max_output_tokens=4, store=False,
                                     truncation="auto")
    assert fitted.truncation == "auto" and fitted.usage.input_tokens + 4 <= limit


def test_background_run_survives_a_restart_of_the_web_process(hf_cache, tmp_path):
    env = base_env(hf_cache, tmp_path)
    first = LiveServer(env, tmp_path, name="before")
    client = sdk(first)
    queued = client.responses.create(model=TINY_MODEL, input="Tell me a story.", max_output_tokens=40,
                                     temperature=0, background=True, extra_body={"ignore_eos": True})
    os.killpg(first.process.pid, signal.SIGKILL)  # no clean shutdown: the run dies with its process
    first.process.wait(10)
    second = LiveServer(env, tmp_path, name="after")
    try:
        client = sdk(second, first.key)  # the same team's key, the same database
        done = wait_for(client, queued.id, ("completed", "incomplete", "failed"), timeout=120)
        assert done.status == "incomplete" and done.usage.output_tokens == 40
        assert "running it again here" in second.log()  # taken over, not finished before the kill
        reference = client.responses.create(model=TINY_MODEL, input="Tell me a story.", max_output_tokens=40,
                                            temperature=0, store=False, extra_body={"ignore_eos": True})
        assert done.output_text == reference.output_text
    finally:
        second.stop()
