"""A chat longer than the model's context, in real Chromium against the tiny model (a 512-token context):
under the rolling window (the default) it goes on, the oldest turns left out of each request and marked in
the transcript; "truncate middle" keeps the first turn; "stop at the limit" says so before anything is sent,
and starts a new chat with the last turns."""
from __future__ import annotations

import json

from .conftest import screenshot
from .pages import axe_violations, chat_settings, conversation_id, send_message, stored_conversation, \
    store_conversation, wait_for_answer
from ..conftest import TINY_MODEL

CONTEXT = 512  # the tiny model's max_position_embeddings
MAX_TOKENS = 16
NOT_SENT = "not sent: beyond the context"


def turn_text(n: int, words: int = 30) -> str:
    return f"Turn {n}: " + " ".join(f"note{n}x{i}" for i in range(words))


def chat_requests(page) -> list:
    """Every /v1/chat/completions the page sends from now on: [request, response status or None]."""
    seen: list = []
    page.on("request", lambda request: request.url.endswith("/v1/chat/completions") and seen.append([request, None]))
    page.on("response", lambda response: response.url.endswith("/v1/chat/completions") and [
        entry.__setitem__(1, response.status) for entry in seen if entry[0] == response.request])
    return seen


def marked(page) -> list[bool]:
    """For each drawn message: whether it is marked as not sent."""
    return page.evaluate("() => [...document.querySelectorAll('#messages > .message')]"
                         ".map((m) => m.classList.contains('not-sent'))")


def test_a_rolling_window_chat_goes_on_for_ten_turns_past_the_context(page_of, web_server):
    page = page_of("alice")
    chat_settings(page, temperature=0, max_tokens=MAX_TOKENS)
    assert page.input_value("#overflow") == "rolling"  # the default
    requests = chat_requests(page)
    for n in range(1, 11):
        send_message(page, turn_text(n))
        wait_for_answer(page)
        assert page.is_hidden("#error"), f"turn {n}: {page.inner_text('#error')}"
    assert [status for _, status in requests] == [200] * 10

    # The first requests sent everything; the later ones left the oldest turns out, the latest always in.
    sent = [json.loads(request.post_data)["messages"] for request, _ in requests]
    assert [m["content"] for m in sent[0]] == [turn_text(1)]
    last = sent[-1]
    assert last[-1] == {"role": "user", "content": turn_text(10)}
    assert last[0]["content"] != turn_text(1) and last[0]["role"] == "user"
    assert len(last) < 19

    # The left-out messages are marked in the transcript, as the stored answer says: the oldest ones.
    flags = marked(page)
    assert len(flags) == 20
    left_out = flags.index(False)
    assert left_out >= 2 and not any(flags[left_out:]) and all(flags[:left_out]), flags
    assert left_out == 19 - len(last)  # every message before the last answer is either sent or marked
    labels = page.locator("#messages .not-sent-label").all_inner_texts()
    assert labels == [NOT_SENT] * left_out
    stored = stored_conversation(page, web_server, conversation_id(page)).json()["messages"]
    assert stored[-1]["stats"]["not_sent"] == [[0, left_out]]
    usage = stored[-1]["stats"]["usage"]
    assert usage["prompt_tokens"] + MAX_TOKENS <= CONTEXT

    # The meter counts what the next turn sends and says how much is left out.
    page.fill("#prompt", turn_text(11))
    page.wait_for_function("() => /not sent/.test(document.getElementById('context-meter').textContent)")
    meter = page.inner_text("#context-meter")
    assert f"/ {CONTEXT} tokens" in meter and "earlier messages not sent" in meter, meter

    # Reopened, the marks are still there (they are the stored answer's).
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    assert marked(page) == flags
    page.locator("#messages .message.not-sent").last.scroll_into_view_if_needed()
    screenshot(page, "chat-overflow-rolling")
    assert axe_violations(page) == []
    assert page.js_errors == []


def test_truncate_middle_keeps_the_first_turn(page_of, web_server):
    page = page_of("alice")
    # A long chat stored as it is (no generation): 8 turns, then one message under "truncate middle".
    messages = []
    for n in range(1, 9):
        messages += [{"role": "user", "content": turn_text(n)}, {"role": "assistant", "content": f"Answer {n}."}]
    conversation = store_conversation(page, web_server, {"title": "Long", "model": TINY_MODEL, "messages": messages,
                                                          "options": {"temperature": 0, "max_tokens": MAX_TOKENS,
                                                                      "overflow": "middle"}})
    page.goto(f"{web_server.base_url}/chat?c={conversation}")
    page.wait_for_selector("body[data-ready=true]")
    chat_settings(page)
    assert page.input_value("#overflow") == "middle"
    requests = chat_requests(page)
    send_message(page, turn_text(9))
    wait_for_answer(page)
    assert page.is_hidden("#error"), page.inner_text("#error")
    assert [status for _, status in requests] == [200]
    sent = json.loads(requests[0][0].post_data)["messages"]
    assert sent[:2] == messages[:2]  # the first turn
    assert sent[-1]["content"] == turn_text(9)
    flags = marked(page)
    # Sent: the first turn, then the latest turns; left out: one block in the middle, marked.
    assert flags[:2] == [False, False] and flags[2] and flags[-2:] == [False, False], flags
    block_end = flags.index(False, 2)
    assert all(flags[2:block_end]) and not any(flags[block_end:]), flags
    assert len(sent) == len(flags) - 1 - (block_end - 2)
    assert page.js_errors == []


def test_stop_at_the_limit_says_so_before_sending_and_starts_a_new_chat_with_the_last_turns(page_of, web_server):
    page = page_of("alice")
    chat_settings(page, temperature=0, max_tokens=MAX_TOKENS, overflow="stop")
    requests = chat_requests(page)
    for n in range(1, 10):
        sent_before = len(requests)
        send_message(page, turn_text(n, words=20))
        wait_for_answer(page)
        if page.is_visible("#error"):
            break
        assert [status for _, status in requests] == [200] * len(requests)
    else:
        raise AssertionError("the chat never reached the context's end")
    assert n >= 2
    # Said before sending: no request for this turn, the message is back in the box, nothing marked.
    assert len(requests) == sent_before
    error = page.inner_text("#error")
    assert "stop at the limit" in error and "nothing was sent" in error, error
    assert page.input_value("#prompt") == turn_text(n, words=20)
    assert page.locator("#messages .message").count() == 2 * (n - 1)
    assert not any(marked(page))
    page.wait_for_function("() => /full/.test(document.getElementById('context-meter').textContent)")
    page.wait_for_selector("#carry-over:visible")
    old = conversation_id(page)
    page.click("#settings summary")  # closed: the messages, the message and the way on in view
    screenshot(page, "chat-overflow-stop")
    assert axe_violations(page) == []

    # A new chat with the last turns; the old one is kept whole; the message in the box goes there.
    page.click("#carry-over")
    page.wait_for_function(f"() => new URLSearchParams(location.search).get('c') !== '{old}'")
    page.wait_for_selector("body:not([data-busy])")
    assert "carried over" in page.inner_text("#notice")
    assert page.is_hidden("#error") and page.is_hidden("#context-full")
    assert len(stored_conversation(page, web_server, old).json()["messages"]) == 2 * (n - 1)
    carried = stored_conversation(page, web_server, conversation_id(page)).json()
    assert carried["title"].endswith("(continued)") and carried["options"]["overflow"] == "stop"
    assert 2 <= len(carried["messages"]) < 2 * (n - 1)
    assert carried["messages"][-1]["content"] == stored_conversation(page, web_server, old).json()["messages"][-1]["content"]
    page.press("#prompt", "Enter")
    wait_for_answer(page)
    assert page.is_hidden("#error"), page.inner_text("#error")
    assert requests[-1][1] == 200
    assert page.js_errors == []
