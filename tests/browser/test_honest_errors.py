"""Errors that say what happened, in real Chromium: a server that cannot be reached (a banner, retries,
nothing lost, the model list kept), the context meter that spends no request quota, and a remembered
Max tokens fitted to what the context has left."""
from __future__ import annotations

import re
import time

from ..conftest import TINY_MODEL
from .pages import chat_settings, conversation_id, send_message, stored_conversation, wait_for_answer

METER_COUNTED = "() => /\\d+ \\/ \\d+ tokens/.test(document.getElementById('context-meter').textContent)"


def network(page, cdp, offline: bool = False, bytes_per_second: int = -1) -> None:
    cdp.send("Network.emulateNetworkConditions", {"offline": offline, "latency": 0,
                                                  "downloadThroughput": bytes_per_second, "uploadThroughput": -1})


def test_an_unreachable_server_is_said_and_retried_and_nothing_is_lost(page_of, web_server):
    page = page_of("alice")
    chat_settings(page, temperature=0, max_tokens=200)
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    # The network goes while an answer streams (as when the server is killed mid-answer).
    network(page, cdp, bytes_per_second=3000)
    send_message(page, "Tell me a story")
    page.wait_for_function("() => (document.querySelector('.message.assistant.streaming .body')?.textContent || '')"
                           ".length > 2", timeout=60_000)
    network(page, cdp, offline=True)
    wait_for_answer(page)
    # The picker keeps its models (not "No models"), and its badge does not claim "loaded".
    assert page.input_value("[data-model-select]") == TINY_MODEL
    assert page.inner_text("[data-model-status]") == "unreachable"
    page.wait_for_selector("#offline:not([hidden])")
    assert "cannot be reached" in page.inner_text("#offline")
    assert re.search(r"Trying again in \d+ s", page.inner_text("#offline-when"))
    kept = page.locator(".message.assistant .body").inner_text()
    assert kept

    # A send now says the server cannot be reached (not "Pick a model first."), and keeps the text.
    page.fill("#prompt", "Are you there?")
    page.press("#prompt", "Enter")
    page.wait_for_selector("#error:not([hidden])")
    assert "cannot be reached" in page.inner_text("#error")
    assert "Pick a model" not in page.inner_text("#error")
    assert page.input_value("#prompt") == "Are you there?"

    # The network is back: the page's own retry finds it, the banner goes, the partial answer is saved.
    network(page, cdp)
    page.wait_for_selector("#offline", state="hidden", timeout=40_000)
    assert page.inner_text("[data-model-status]") == "loaded"
    assert page.is_hidden("#error")
    deadline = time.monotonic() + 15  # the page saves the kept answer once it reaches the server again
    while len(stored := stored_conversation(page, web_server, conversation_id(page)).json()["messages"]) < 2 \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [m["role"] for m in stored] == ["user", "assistant"] and stored[1]["content"].strip() == kept.strip()
    page.press("#prompt", "Enter")
    wait_for_answer(page)
    assert page.is_hidden("#error"), page.inner_text("#error")
    assert page.locator(".message.assistant").count() == 2
    assert page.js_errors == []


def test_the_context_meter_spends_no_request_quota(page_of, web_server):
    page = page_of("tess")  # team "tight": 3 requests a minute
    statuses: list[int] = []
    page.on("response", lambda response: "/tokenize" in response.url and statuses.append(response.status))
    chat_settings(page, temperature=0, max_tokens=2)
    for text in ("one", "two"):
        page.fill("#prompt", text)  # the meter counts the draft
        page.wait_for_function(METER_COUNTED)
        page.evaluate("() => { document.getElementById('context-meter').textContent = ''; }")
        send_message(page, text)
        wait_for_answer(page)
        page.wait_for_function(METER_COUNTED)  # and the conversation once answered
        assert page.is_hidden("#error"), page.inner_text("#error")
    assert len(statuses) >= 4 and set(statuses) == {200}, statuses

    # Only the two answers were requests of the team's: none of the meter's /tokenize calls.
    def requests_counted() -> int:
        return page.request.get(f"{web_server.base_url}/v1/key").json()["data"]["period_requests"]

    deadline = time.monotonic() + 10
    while requests_counted() < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)
    assert requests_counted() == 2
    assert page.js_errors == []


def test_a_remembered_max_tokens_is_fitted_to_what_the_context_has_left(page_of, web_server):
    page = page_of("alice")
    chat_settings(page, temperature=0, max_tokens=400)  # the tiny model's context is 512 tokens
    send_message(page, "hello there " * 100)
    wait_for_answer(page)
    assert page.is_hidden("#error"), page.inner_text("#error")
    note = page.inner_text("#notice")
    room = int(re.search(r"Max tokens is 400, .* at most (\d+)\.", note).group(1))
    answer = stored_conversation(page, web_server, conversation_id(page)).json()["messages"][1]
    usage = answer["stats"]["usage"]
    assert usage["prompt_tokens"] + room == 512
    assert 0 < usage["completion_tokens"] <= room
    assert page.input_value("#max-tokens") == "400"  # the setting itself is kept
    assert page.js_errors == []
