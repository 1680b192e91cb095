"""/login and /chat in real Chromium against a real server and the tiny model."""
from __future__ import annotations

import re
import time

from openai import OpenAI

from ..conftest import TINY_MODEL
from ..live_server import LiveServer, base_env
from .conftest import PASSWORD, log_in, make_users, screenshot
from .pages import (
    csrf_header,
    chat_settings,
    conversation_id,
    record_open_reasoning,
    record_streamed_lengths,
    send_message,
    slow_network,
    store_conversation,
    stored_conversation,
    wait_for_answer,
)


def sdk(server) -> OpenAI:
    return OpenAI(base_url=f"{server.base_url}/v1", api_key=server.key, max_retries=0, timeout=120)


def test_login_logout_and_page_headers(chromium, web_server, users):
    context = chromium.new_context()
    page = context.new_page()
    response = page.goto(f"{web_server.base_url}/chat")
    assert page.url.endswith("/login?next=/chat")
    assert response.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    assert "script-src 'self'" in response.headers["content-security-policy"]
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", "not the password")
    page.click("form button[type=submit]")
    assert "Wrong username or password" in page.inner_text(".login-card")
    screenshot(page, "login")
    page.fill("input[name=password]", PASSWORD)
    page.click("form button[type=submit]")
    page.wait_for_url("**/chat")
    assert page.inner_text("[data-testid=username]") == "alice"
    page.click("form.logout button")
    page.wait_for_url("**/login")
    page.goto(f"{web_server.base_url}/playground")
    assert "/login?next=/playground" in page.url
    context.close()


def test_chat_streams_an_answer_equal_to_the_api_and_keeps_the_conversation(page_of, web_server):
    page = page_of("alice")
    chat_settings(page, temperature=0, max_tokens=40)
    record_streamed_lengths(page)
    with slow_network(page):
        send_message(page, "Tell me a story about a lighthouse.")
        wait_for_answer(page)
    assert page.is_hidden("#error"), page.inner_text("#error")

    lengths = page.evaluate("() => window.streamedLengths")
    assert len({n for n in lengths if n > 0}) >= 3, f"the answer did not stream in: {lengths}"
    stats = page.inner_text(".message.assistant .stats")
    assert re.search(r"[\d.]+ tokens/s", stats) and "prompt +" in stats and "completion tokens" in stats

    # Greedy through the page equals greedy through the SDK.
    expected = sdk(web_server).chat.completions.create(
        model=TINY_MODEL, messages=[{"role": "user", "content": "Tell me a story about a lighthouse."}],
        temperature=0, max_tokens=40)
    conversation = conversation_id(page)
    stored = stored_conversation(page, web_server, conversation).json()
    assert [m["role"] for m in stored["messages"]] == ["user", "assistant"]
    answer = stored["messages"][1]
    assert answer["content"] == expected.choices[0].message.content
    assert answer["stats"]["usage"]["completion_tokens"] == expected.usage.completion_tokens
    assert stored["title"] == "Tell me a story about a lighthouse."
    screenshot(page, "chat")

    # A reload, and another browser, show the stored conversation.
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    assert page.inner_text(".message.user .body") == "Tell me a story about a lighthouse."
    assert page.locator(".message.assistant").count() == 1
    other = page_of("alice")
    other.click(f"#conversation-list li[data-id='{conversation}'] .open")
    other.wait_for_selector(".message.assistant")
    assert other.inner_text(".message.user .body") == "Tell me a story about a lighthouse."

    # Edit the last message: the conversation continues from the edited text.
    page.click(".message.user .meta button:text('Edit')")
    page.fill(".message.user textarea", "Tell me about the sea.")
    page.click(".message.user button:text('Save & send')")
    wait_for_answer(page)
    stored = stored_conversation(page, web_server, conversation).json()
    assert [m["content"] for m in stored["messages"] if m["role"] == "user"] == ["Tell me about the sea."]
    assert len(stored["messages"]) == 2
    # The first text and its answer are kept as version 1 of 2.
    earlier = stored["messages"][0]["versions"]
    assert [v["message"]["content"] for v in earlier] == ["Tell me a story about a lighthouse."]
    assert earlier[0]["tail"][0]["content"] == answer["content"]
    assert page.inner_text(".message.user .versions .count") == "2/2"

    # Regenerate replaces the answer (it streams again; still one answer).
    record_streamed_lengths(page)
    with slow_network(page):  # the 40 tokens could otherwise arrive in one paint, never seen streaming
        page.click(".message.assistant .meta button:text('Regenerate')")
        wait_for_answer(page)
    assert any(n > 0 for n in page.evaluate("() => window.streamedLengths"))
    stored = stored_conversation(page, web_server, conversation).json()
    assert len(stored["messages"]) == 2
    assert len(stored["messages"][1]["versions"]) == 1  # the earlier answer is kept
    assert page.inner_text(".message.assistant .versions .count") == "2/2"

    # Rename and delete from the list.
    page.hover(f"#conversation-list li[data-id='{conversation}']")  # Rename and Delete show under the pointer
    page.click(f"#conversation-list li[data-id='{conversation}'] button:text('Rename')")
    page.fill("#conversation-list input", "Sea stories")
    page.press("#conversation-list input", "Enter")
    page.wait_for_selector("#conversation-list .open:text('Sea stories')")
    assert stored_conversation(page, web_server, conversation).json()["title"] == "Sea stories"
    page.hover(f"#conversation-list li[data-id='{conversation}']")
    page.click(f"#conversation-list li[data-id='{conversation}'] button:text('Delete')")
    page.click("#conversation-list button:text('Delete it')")
    page.wait_for_selector(f"#conversation-list li[data-id='{conversation}']", state="detached")
    assert stored_conversation(page, web_server, conversation).status == 404
    assert page.js_errors == []


def test_stop_cancels_the_generation_on_the_server(page_of, web_server):
    page = page_of("alice")
    chat_settings(page, temperature=0, max_tokens=400)
    send_message(page, "Count to a thousand.")
    page.wait_for_function("() => document.querySelector('.message.assistant.streaming .body')?.textContent.length > 0",
                           timeout=60_000)
    request_id = page.get_attribute(".message.assistant.streaming", "data-request-id")
    assert request_id.startswith("chatcmpl-")
    page.click("#stop")
    wait_for_answer(page)

    deadline = time.monotonic() + 30
    while f"cancelled {request_id}" not in web_server.log():
        assert time.monotonic() < deadline, web_server.log()[-3000:]
        time.sleep(0.05)
    generated = int(re.search(rf"cancelled {request_id} after (\d+) tokens", web_server.log()).group(1))
    assert generated < 400
    assert "finish: stopped" in page.inner_text(".message.assistant .stats")
    stored = stored_conversation(page, web_server, conversation_id(page)).json()
    assert stored["messages"][1]["stats"]["finish_reason"] == "stopped"
    assert stored["messages"][1]["content"]  # the partial answer is kept

    # The server goes on serving.
    chat_settings(page, max_tokens=4)
    send_message(page, "Again")
    wait_for_answer(page)
    assert page.locator(".message.assistant").count() == 2


def test_reasoning_is_a_collapsible_block(page_of, web_server):
    page = page_of("alice")
    chat_settings(page, temperature=0, max_tokens=24, thinking="on")
    record_open_reasoning(page)
    with slow_network(page):  # 24 tokens could otherwise arrive in one paint, the reasoning never seen open
        send_message(page, "Think first.")
        wait_for_answer(page)
    # A MutationObserver, not polling: a fast stream can be over before a poll sees it.
    assert page.evaluate("() => window.sawOpenReasoning")
    reasoning = page.locator(".message.assistant details.reasoning")
    assert reasoning.get_attribute("open") is None  # collapsed once the answer is done
    page.click(".message.assistant details.reasoning summary")
    assert reasoning.get_attribute("open") is not None
    text = page.inner_text(".message.assistant details.reasoning .text")
    stored = stored_conversation(page, web_server, conversation_id(page)).json()
    assert stored["messages"][1]["reasoning_content"].strip() == text.strip() != ""
    screenshot(page, "chat-reasoning")


MARKDOWN_ANSWER = """Here is the code:

```python
print("hello")
```

<img src=x onerror="window.injected=1"><script>window.injected=2</script>
**bold** and a [link](https://example.org)."""


def test_markdown_code_blocks_tool_calls_and_no_injected_html(page_of, web_server):
    page = page_of("alice")
    conversation = store_conversation(page, web_server, {
        "title": "Markdown", "model": TINY_MODEL, "messages": [
            {"role": "user", "content": "<b>not bold</b> show me code"},
            {"role": "assistant", "content": MARKDOWN_ANSWER},
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        ]})
    page.goto(f"{web_server.base_url}/chat?c={conversation}")
    page.wait_for_selector("body[data-ready=true]")
    page.wait_for_selector(".message.assistant pre code")
    assert page.inner_text(".message.assistant pre code").strip() == 'print("hello")'
    assert page.inner_text(".message.assistant strong") == "bold"
    assert page.get_attribute(".message.assistant a", "rel") == "noopener noreferrer nofollow"
    assert page.locator(".message img, .message script").count() == 0
    assert page.evaluate("() => window.injected") is None
    assert page.inner_text(".message.user >> nth=0").startswith("<b>not bold</b>")  # user text is text
    assert page.inner_text(".tool-call .name") == "get_weather"
    assert '"city": "Paris"' in page.inner_text(".tool-call pre")
    screenshot(page, "chat-markdown")


def test_errors_are_shown_as_such(page_of, web_server):
    page = page_of("alice")
    chat_settings(page, temperature=5)  # the API takes 0 to 2 (a Max tokens past the context is fitted to it)
    send_message(page, "hello")
    wait_for_answer(page)
    assert "temperature" in page.inner_text("#error")


def test_api_takes_the_session_cookie_only_with_csrf(page_of, web_server):
    page = page_of("alice")
    url = f"{web_server.base_url}/v1/completions"
    body = {"model": TINY_MODEL, "prompt": "Hi", "max_tokens": 2}
    refused = page.request.post(url, data=body)
    assert refused.status == 403
    assert "CSRF" in refused.json()["error"]["message"]
    token = page.get_attribute('meta[name="csrf-token"]', "content")
    accepted = page.request.post(url, data=body, headers={"X-CSRFToken": token})
    assert accepted.status == 200, accepted.text()
    assert accepted.json()["usage"]["completion_tokens"] == 2
    cross_site = page.request.post(url, data=body, headers={"X-CSRFToken": token, "Origin": "https://evil.example"})
    assert cross_site.status == 403


def test_a_user_never_sees_another_users_conversations(page_of, web_server):
    alice = page_of("alice")
    conversation = store_conversation(alice, web_server, {"title": "Alice's secret", "messages": [
        {"role": "user", "content": "secret"}]})
    bob = page_of("bob")
    assert "Alice's secret" not in bob.inner_text("#conversation-list")
    assert stored_conversation(bob, web_server, conversation).status == 404
    bob.goto(f"{web_server.base_url}/chat?c={conversation}")
    bob.wait_for_selector("#error:not([hidden])")
    assert bob.locator(".message").count() == 0


def test_chat_fits_a_phone(page_of, web_server):
    page = page_of("alice", width=375, height=740)
    chat_settings(page, temperature=0, max_tokens=16)
    send_message(page, "A short one")
    wait_for_answer(page)
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 375
    screenshot(page, "chat-375px")
    page.click("#sidebar-toggle")
    page.wait_for_selector("#sidebar.open")
    page.wait_for_timeout(300)
    screenshot(page, "chat-375px-conversations")


def test_model_picker_loads_a_model_with_progress(page_of, web_server):
    import httpx

    unloaded = httpx.post(f"{web_server.base_url}/unload_model", headers=web_server.headers, json={"model": TINY_MODEL},
                          timeout=60)
    assert unloaded.json()["status"] == "unloaded"
    member = page_of("alice")  # loading is an operator's act: a member's first request loads the model
    assert member.inner_text("[data-model-status]") == "cached"
    assert member.is_hidden("[data-model-load]")
    page = page_of("olga")
    assert page.inner_text("[data-model-status]") == "cached"
    page.evaluate("""() => {
        window.progressTexts = [];
        const text = document.querySelector('[data-model-progress-text]');
        new MutationObserver(() => window.progressTexts.push(text.textContent))
            .observe(text, {childList: true, characterData: true, subtree: true});
    }""")
    page.click("[data-model-load]")
    page.wait_for_selector("[data-model-status].loaded", timeout=120_000)
    seen = page.evaluate("() => window.progressTexts")
    assert any(re.match(r"loading weights \d+/\d+", text) for text in seen), seen
    assert page.is_hidden("[data-model-progress]")


def test_the_conversation_store_validates_what_it_keeps(page_of, web_server):
    page = page_of("bob")
    url = f"{web_server.base_url}/ui/api/conversations"
    for body, param in [({"title": "x", "colour": "red"}, "colour"),
                        ({"title": "x", "messages": [{"role": "system", "content": "hi"}]}, "messages[0].role"),
                        ({"title": "x" * 201}, "title"),
                        ({"title": "x", "options": {"temperature": 5}}, "options.temperature"),
                        ({"title": "x", "options": {"overflow": "sideways"}}, "options.overflow"),
                        ({"title": "x", "messages": [{"role": "assistant", "content": "a",
                                                      "stats": {"not_sent": [[0]]}}]}, "messages[0].stats.not_sent")]:
        response = page.request.post(url, data=body, headers=csrf_header(page))
        assert response.status == 400, body
        assert response.json()["error"]["param"] == param
    assert page.request.post(url, data={"title": "x"}).status == 403  # no CSRF token


def test_no_worker_is_said_plainly(chromium, hf_cache, tmp_path):
    env = base_env(hf_cache, tmp_path, INFERENCE_WORKER_ACK_TIMEOUT="1")
    live = LiveServer(env, tmp_path, extra_args=("--no-worker",), name="no-worker")
    live.env = env
    context = chromium.new_context()
    try:
        make_users(live)
        page = context.new_page()
        log_in(page, live, "alice")
        send_message(page, "Anyone there?")
        wait_for_answer(page)
        assert page.inner_text("#error") == "No inference worker is available right now. Try again in 5 s."
    finally:
        context.close()
        live.stop()
