"""Nothing typed on /chat is lost: bad settings, a failed Regenerate, a server stopped mid-stream, two tabs."""
from __future__ import annotations

import time

import httpx
import pytest

from .. import live_server
from ..conftest import TINY_MODEL
from ..live_server import LiveServer, base_env
from .conftest import log_in, make_users, screenshot
from .pages import (
    DONE_TIMEOUT_MS,
    chat_settings,
    conversation_id,
    csrf_header,
    send_message,
    store_conversation,
    stored_conversation,
    wait_for_answer,
)


def until_stored(page, server, conversation: int, check, timeout: float = 30):
    """The stored conversation once `check(it)` holds (a write the page makes after a click)."""
    deadline = time.monotonic() + timeout
    while True:
        stored = stored_conversation(page, server, conversation).json()
        if check(stored) or time.monotonic() > deadline:
            return stored
        time.sleep(0.1)


def test_bad_settings_keep_the_message_in_the_box_and_send_nothing(page_of, web_server):
    page = page_of("alice")
    chat_settings(page, max_tokens=4, tools="[not json")
    page.fill("#prompt", "my careful words")
    page.press("#prompt", "Enter")
    page.wait_for_selector("#error:not([hidden])")
    assert page.inner_text("#error") == "Tools is not valid JSON."
    assert page.input_value("#prompt") == "my careful words"  # still in the box
    assert page.locator(".message").count() == 0
    assert page.evaluate("() => new URLSearchParams(location.search).get('c')") is None  # nothing saved

    chat_settings(page, tools="")
    send_message(page, "my careful words")
    wait_for_answer(page)
    stored = stored_conversation(page, web_server, conversation_id(page)).json()
    assert [m["role"] for m in stored["messages"]] == ["user", "assistant"]  # one user turn, no ghost
    assert stored["messages"][0]["content"] == "my careful words"
    assert page.input_value("#prompt") == ""


def test_a_failed_regenerate_keeps_the_answer_and_versions_can_be_browsed(page_of, web_server):
    page = page_of("alice")
    chat_settings(page, temperature=0, max_tokens=8)
    send_message(page, "First question")
    wait_for_answer(page)
    conversation = conversation_id(page)
    first = stored_conversation(page, web_server, conversation).json()["messages"][1]["content"]

    chat_settings(page, temperature=5)  # past the API's 2: the server refuses it
    page.click(".message.assistant .meta button:text('Regenerate')")
    wait_for_answer(page)
    assert "temperature" in page.inner_text("#error")
    assert page.locator(".message.assistant").count() == 1
    assert page.evaluate("() => document.querySelector('.message.assistant .body').textContent").strip() == first.strip()
    assert stored_conversation(page, web_server, conversation).json()["messages"][1]["content"] == first

    chat_settings(page, temperature=1.5, max_tokens=8)
    page.click(".message.assistant .meta button:text('Regenerate')")
    wait_for_answer(page)
    stored = stored_conversation(page, web_server, conversation).json()
    second = stored["messages"][1]["content"]
    assert stored["messages"][1]["versions"][0]["message"]["content"] == first
    assert page.inner_text(".message.assistant .versions .count") == "2/2"
    page.click(".message.assistant .versions button[aria-label='Previous version']")
    page.wait_for_selector(".message.assistant .versions .count:text('1/2')")
    stored = until_stored(page, web_server, conversation, lambda s: s["messages"][1]["content"] == first)
    assert stored["messages"][1]["content"] == first
    assert stored["messages"][1]["versions"][0]["message"]["content"] == second
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    assert page.inner_text(".message.assistant .versions .count") == "1/2"
    screenshot(page, "chat-versions")


def test_two_tabs_never_overwrite_each_other(page_of, web_server):
    first = page_of("alice")
    conversation = store_conversation(first, web_server, {"title": "Shared", "model": TINY_MODEL, "messages": []})
    second = page_of("alice")
    for page in (first, second):
        page.goto(f"{web_server.base_url}/chat?c={conversation}")
        page.wait_for_selector("body[data-ready=true]")
        chat_settings(page, temperature=0, max_tokens=4)
    send_message(first, "from the first tab")
    wait_for_answer(first)
    send_message(second, "from the second tab")  # this tab has not seen the first tab's turn
    wait_for_answer(second)
    stored = stored_conversation(first, web_server, conversation).json()
    users = [m["content"] for m in stored["messages"] if m["role"] == "user"]
    assert users == ["from the first tab", "from the second tab"]
    assert [m["role"] for m in stored["messages"]] == ["user", "assistant", "user", "assistant"]
    assert "another tab" in second.inner_text("#notice")

    # The store itself refuses a stale write.
    stale = first.request.post(f"{web_server.base_url}/ui/api/conversations/{conversation}/turns",
                               headers=csrf_header(first),
                               data={"version": 0, "at": 0, "messages": [{"role": "user", "content": "overwrite"}]})
    assert stale.status == 409
    assert stale.json()["error"]["code"] == "conversation_changed"
    assert len(stored_conversation(first, web_server, conversation).json()["messages"]) == 4


@pytest.fixture
def own_server(two_model_cache, tmp_path, monkeypatch):
    """A server of this test's own, which the test stops and starts again on the same port and database."""
    env = base_env(two_model_cache, tmp_path, INFERENCE_WORKER_ACK_TIMEOUT="90", INFERENCE_WORKER_LOST_AFTER="90")
    servers = []

    def start(port: int | None = None) -> LiveServer:
        if port is not None:
            monkeypatch.setattr(live_server, "free_port", lambda: port)
        server = LiveServer(env, tmp_path, name=f"restart-{len(servers)}")
        server.env = env
        servers.append(server)
        warm_up = httpx.post(f"{server.base_url}/v1/completions", headers=server.headers, timeout=180,
                             json={"model": TINY_MODEL, "prompt": "warm up", "max_tokens": 1})
        assert warm_up.status_code == 200, warm_up.text
        return server

    yield start
    for server in servers:
        server.stop()


def test_a_server_stopped_mid_stream_loses_neither_question_nor_partial_answer(chromium, own_server):
    server = own_server()
    make_users(server)
    context = chromium.new_context()
    page = context.new_page()
    try:
        log_in(page, server, "alice")
        chat_settings(page, temperature=0, max_tokens=400)
        send_message(page, "A long story, please.")
        page.wait_for_function(
            "() => document.querySelector('.message.assistant.streaming .body')?.textContent.length > 0",
            timeout=DONE_TIMEOUT_MS)
        conversation = conversation_id(page)
        server.kill()  # a crash mid-stream (SIGTERM would drain the answer: graceful stop)
        wait_for_answer(page)
        assert page.is_visible("#error")
        partial = page.inner_text(".message.assistant .body")
        assert partial
        assert "kept in this browser" in page.inner_text("#notice")

        assert page.is_visible("#offline")  # the page says the server cannot be reached, and keeps trying

        restarted = own_server(port=server.port)
        # Try now (unless the page's own next try already found it).
        page.evaluate("() => { const retry = document.getElementById('offline-retry'); "
                      "if (retry.checkVisibility()) retry.click(); }")
        page.wait_for_selector("#offline", state="hidden", timeout=DONE_TIMEOUT_MS)
        page.wait_for_function("() => document.getElementById('notice').textContent.includes('saved now')")
        stored = stored_conversation(page, restarted, conversation).json()
        assert [m["role"] for m in stored["messages"]] == ["user", "assistant"]
        assert stored["messages"][0]["content"] == "A long story, please."
        # What the page showed is what it stored: compared as the reader sees it (a random model's text holds
        # control characters and runs of spaces that the page's rendering drops or folds).
        assert visible(stored["messages"][1]["content"]) == visible(partial) or \
            visible(stored["messages"][1]["content"]).startswith(visible(partial)[:20])
        page.goto(f"{restarted.base_url}/chat?c={conversation}")
        page.wait_for_selector("body[data-ready=true]")
        assert page.locator(".message.assistant").count() == 1
    finally:
        context.close()


def visible(text: str) -> str:
    """The text's printable characters, without white space: what any rendering of it shows."""
    return "".join(char for char in text if char.isprintable() and not char.isspace())
