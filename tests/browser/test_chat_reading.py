"""Reading while it streams, and the composer, in real Chromium with the tiny model.

Esc stops an answer and focus stays in the box; the list follows the answer only while the reader is
at the bottom; a selection in an earlier block survives; only the finished answer is announced; the
box grows with its text; Continue goes on from a cut-off answer as the API does; Edit of an answer
keeps the earlier one as a version.
"""
from __future__ import annotations

import json

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from openai import OpenAI

from ..conftest import TINY_MODEL
from .conftest import browser_server, make_users
from .pages import (
    chat_settings,
    conversation_id,
    send_message,
    stop_answer,
    store_conversation,
    stored_conversation,
    wait_for_answer,
)

STREAMING_BODY = ".message.assistant.streaming .body"


@pytest.fixture(scope="module")
def web_server(two_model_cache, tmp_path_factory, thinking_template):
    """This module's own server, each forward 15 ms longer (a failpoint's delay): its tests watch an answer grow
    while the reader scrolls, selects or stops, and the tiny model otherwise writes 330 tokens in a second or
    two, sometimes before the test has looked (seen under `-n 2` on two cores)."""
    live = browser_server(two_model_cache, tmp_path_factory.mktemp("reading-server"), thinking_template,
                          INFERENCE_FAILPOINTS="engine.forward=delay(15)")
    yield live
    live.stop()


@pytest.fixture(scope="module")
def users(web_server) -> dict[str, str]:
    return make_users(web_server)
TALL_TEXT = "\n".join(["- a"] * 24)  # tall on screen, few tokens


def wait_until_streaming(page, min_length: int = 1) -> None:
    page.wait_for_function(f"() => document.querySelector('{STREAMING_BODY}')?.textContent.length >= {min_length}"
                           " || !document.getElementById('error').hidden", timeout=60_000)
    assert page.is_hidden("#error"), page.inner_text("#error")


def streamed_length(page) -> int:
    return page.evaluate(f"() => document.querySelector('{STREAMING_BODY}')?.textContent.length ?? -1")


def wait_for_growth(page, than: int, by: int = 20) -> None:
    """Until the streaming answer is `by` characters longer than `than` (or it ended)."""
    page.wait_for_function(
        f"() => {{ const b = document.querySelector('{STREAMING_BODY}'); return !b || b.textContent.length >= {than + by}; }}",
        timeout=60_000)


def open_stored(page, server, messages: list[dict], max_tokens: int) -> int:
    conversation = store_conversation(page, server, {"title": "Stored", "model": TINY_MODEL, "messages": messages,
                                                     "options": {"temperature": 0.0, "max_tokens": max_tokens}})
    page.goto(f"{server.base_url}/chat?c={conversation}")
    page.wait_for_selector("body[data-ready=true]")
    return conversation


def test_escape_and_stop_end_the_answer_and_focus_stays_in_the_box(page_of, web_server):
    page = page_of("alice")
    chat_settings(page, temperature=0, max_tokens=300)
    send_message(page, "Count to a thousand.")
    wait_until_streaming(page)
    assert page.is_hidden("#send") and page.is_visible("#stop")  # no dead Send while it streams
    page.focus("#prompt")
    page.keyboard.press("Escape")
    wait_for_answer(page)
    assert "finish: stopped" in page.inner_text(".message.assistant .stats")
    assert page.evaluate("() => document.activeElement.id") == "prompt"
    assert page.is_visible("#send") and page.is_hidden("#stop")

    # Stop is a button: clicking it would take the focus; it gives it back to the box. (A random model may
    # end an answer at once with EOS before the click lands: then the next message is tried.)
    for attempt in range(4):
        send_message(page, f"Count again, attempt {attempt}.")
        page.wait_for_function(f"() => document.querySelector('{STREAMING_BODY}')?.textContent.length >= 1"
                               " || !document.body.hasAttribute('data-busy')", timeout=60_000)  # or already over
        try:
            page.click("#stop", timeout=3000)
            break
        except PlaywrightTimeoutError:
            wait_for_answer(page)
    wait_for_answer(page)
    assert "finish: stopped" in page.locator(".message.assistant .stats").last.inner_text()
    assert page.evaluate("() => document.activeElement.id") == "prompt"
    assert page.js_errors == []


def test_the_list_follows_the_answer_only_while_the_reader_is_at_the_bottom(page_of, web_server):
    page = page_of("alice")
    history = [{"role": role, "content": TALL_TEXT} for role in ("user", "assistant")]
    open_stored(page, web_server, history, max_tokens=330)  # the context is 512
    messages = "document.getElementById('messages')"
    assert page.evaluate(f"() => {messages}.scrollHeight > 1.5 * {messages}.clientHeight")
    at_bottom = f"() => {messages}.scrollHeight - {messages}.scrollTop - {messages}.clientHeight < 40"
    send_message(page, "Write at length.")
    wait_until_streaming(page, 10)

    # At the bottom, the list follows the answer as it grows.
    height = page.evaluate(f"() => {messages}.scrollHeight")
    page.wait_for_function(f"() => {messages}.scrollHeight > {height} + 20 || !document.querySelector('{STREAMING_BODY}')",
                           timeout=60_000)
    assert page.locator(STREAMING_BODY).count() == 1, "the answer ended before the test could watch it grow"
    page.wait_for_timeout(50)  # the next frame scrolls
    assert page.evaluate(at_bottom)

    # The reader scrolls up: the answer grows, and the list stays where they are.
    page.mouse.move(600, 300)
    page.mouse.wheel(0, -400)
    page.wait_for_function(f"() => {messages}.scrollTop > 0 && "
                           f"{messages}.scrollHeight - {messages}.scrollTop - {messages}.clientHeight > 150")
    top = page.evaluate(f"() => {messages}.scrollTop")
    height = page.evaluate(f"() => {messages}.scrollHeight")
    page.wait_for_function(f"() => {messages}.scrollHeight > {height} + 20 || !document.querySelector('{STREAMING_BODY}')",
                           timeout=60_000)
    assert page.locator(STREAMING_BODY).count() == 1, "the answer ended before the test could watch it grow"
    page.wait_for_timeout(100)  # a frame or more: a snap back would have happened
    assert abs(page.evaluate(f"() => {messages}.scrollTop") - top) < 2
    stop_answer(page)  # the answer may have ended meanwhile on a fast machine


def test_a_selection_in_the_answer_survives_while_it_streams(page_of, web_server):
    page = page_of("alice")
    first = "A first paragraph to select."
    open_stored(page, web_server, [
        {"role": "user", "content": "Write two paragraphs."},
        {"role": "assistant", "content": f"{first}\n\nThe second one", "stats": {"finish_reason": "length"}},
    ], max_tokens=300)
    page.click(".message.assistant .meta button:text('Continue')")
    wait_until_streaming(page, len(first) + 20)
    page.evaluate(f"""() => {{
        const block = document.querySelector('{STREAMING_BODY} .md-block');
        const range = document.createRange();
        range.selectNodeContents(block);
        getSelection().removeAllRanges();
        getSelection().addRange(range);
    }}""")
    assert page.evaluate("() => getSelection().toString().trim()") == first
    wait_for_growth(page, streamed_length(page), by=60)
    assert page.locator(STREAMING_BODY).count() == 1, "the answer ended before the test could watch it grow"
    assert page.evaluate("() => getSelection().toString().trim()") == first
    stop_answer(page)


def test_only_the_finished_answer_is_announced(page_of, web_server):
    page = page_of("alice")
    assert page.get_attribute("#messages", "aria-live") is None
    assert page.get_attribute("#announce", "aria-live") == "polite"
    chat_settings(page, temperature=0, max_tokens=24)
    page.evaluate("""() => {
        window.announced = [];
        new MutationObserver(() => window.announced.push({
            text: document.getElementById('announce').textContent,
            streaming: Boolean(document.querySelector('.message.assistant.streaming')),
        })).observe(document.getElementById('announce'), {subtree: true, childList: true, characterData: true});
    }""")
    send_message(page, "Tell me something.")
    wait_for_answer(page)
    answer = stored_conversation(page, web_server, conversation_id(page)).json()["messages"][1]["content"]
    announced = page.evaluate("() => window.announced")
    assert [a["text"] for a in announced] == [answer], announced  # once, the whole answer
    assert page.text_content("#announce") == answer


@pytest.mark.parametrize("width, height", [(1200, 800), (390, 844)])
def test_the_box_grows_with_its_text(page_of, width, height):
    page = page_of("alice", width=width, height=height)
    box = lambda: page.evaluate("() => document.getElementById('prompt').getBoundingClientRect().height")  # noqa: E731
    empty = box()
    page.fill("#prompt", "\n".join(f"line {n}" for n in range(6)))
    grown = box()
    assert grown > empty + 40
    page.fill("#prompt", "\n".join(f"line {n}" for n in range(200)))
    assert grown < box() <= 0.4 * height + 4  # at most 40 % of the window: the answer stays in view
    page.fill("#prompt", "")
    assert box() < grown


def test_continue_goes_on_from_a_cut_off_answer_as_the_api_does(page_of, web_server):
    page = page_of("alice")
    chat_settings(page, temperature=0, max_tokens=4)
    send_message(page, "Tell me a long story.")
    wait_for_answer(page)
    conversation = conversation_id(page)
    cut = stored_conversation(page, web_server, conversation).json()["messages"][1]
    assert cut["stats"]["finish_reason"] == "length"
    page.click(".message.assistant .meta button:text('Continue')")
    wait_for_answer(page)
    assert page.is_hidden("#error"), page.inner_text("#error")
    stored = stored_conversation(page, web_server, conversation).json()
    assert len(stored["messages"]) == 2  # the same answer, longer
    client = OpenAI(base_url=f"{web_server.base_url}/v1", api_key=web_server.key, max_retries=0, timeout=120)
    expected = client.chat.completions.create(
        model=TINY_MODEL, temperature=0, max_tokens=4,
        messages=[{"role": "user", "content": "Tell me a long story."}, {"role": "assistant", "content": cut["content"]}],
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert expected.choices[0].message.content
    assert stored["messages"][1]["content"] == cut["content"] + expected.choices[0].message.content
    assert page.evaluate("() => document.querySelector('.message.assistant .body').textContent").strip() == \
        stored["messages"][1]["content"].strip()


def test_editing_an_answer_keeps_the_earlier_one_as_a_version(page_of, web_server):
    page = page_of("alice")
    conversation = open_stored(page, web_server, [{"role": "user", "content": "Say hello."},
                                                  {"role": "assistant", "content": "Original answer."}], max_tokens=4)
    turns = page.get_attribute("body", "data-turns")
    page.click(".message.assistant .meta button:text('Edit')")
    page.fill(".message.assistant textarea", "Edited answer.")
    page.click(".message.assistant button:text('Save')")
    page.wait_for_selector(".message.assistant .versions .count:text('2/2')")
    page.wait_for_selector("body:not([data-busy])")
    stored = stored_conversation(page, web_server, conversation).json()
    answer = stored["messages"][1]
    assert answer["content"] == "Edited answer."
    assert [v["message"]["content"] for v in answer["versions"]] == ["Original answer."]
    assert len(stored["messages"]) == 2  # an edited answer is not answered again
    assert page.get_attribute("body", "data-turns") == str(int(turns or 0) + 1)
    page.click(".message.assistant .versions button[aria-label='Previous version']")
    page.wait_for_selector(".message.assistant .versions .count:text('1/2')")
    assert page.inner_text(".message.assistant .body").strip() == "Original answer."
    assert json.dumps(page.js_errors) == "[]"
