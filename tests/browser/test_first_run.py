"""A new install as a new user finds it: a superuser, a cache with a text, a vision and a speech model.

The superuser can use the pages at once, every default works (the server's default model, never the
speech model), the pickers offer only what each page can use, and an image pasted into the chat
reaches the vision model exactly as the same request through the SDK does.
"""
from __future__ import annotations

import pytest
from openai import OpenAI

from ..conftest import TINY_MODEL, TINY_VLM, TINY_WHISPER
from .conftest import log_in, screenshot
from .pages import chat_settings, conversation_id, doc_text, send_message, stored_conversation, wait_for_answer, \
    wait_for_continuation

PASTE_IMAGE = """async () => {
    const canvas = document.createElement('canvas');
    canvas.width = 32; canvas.height = 24;
    const ctx = canvas.getContext('2d');
    ctx.fillStyle = '#c33'; ctx.fillRect(0, 0, 32, 24);
    ctx.fillStyle = '#3c3'; ctx.fillRect(8, 4, 12, 10);
    const blob = await new Promise((resolve) => canvas.toBlob(resolve, 'image/png'));
    const data = new DataTransfer();
    data.items.add(new File([blob], 'squares.png', {type: 'image/png'}));
    document.getElementById('prompt').dispatchEvent(
        new ClipboardEvent('paste', {clipboardData: data, bubbles: true, cancelable: true}));
}"""


@pytest.fixture(scope="module")
def first_run_server(media_pages_server):
    return media_pages_server


def options_of(page) -> list[str]:
    return page.eval_on_selector_all("[data-model-select] option", "os => os.map(o => o.value)")


@pytest.mark.parametrize("width", [1440, 390])
def test_a_superuser_uses_the_pages_at_once_with_model_aware_defaults(chromium, first_run_server, width):
    context = chromium.new_context(viewport={"width": width, "height": 900 if width > 500 else 844})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        log_in(page, first_run_server, "root")
        phone = page.is_visible("#menu-toggle")
        if phone:  # the staff links are behind Menu
            page.click("#menu-toggle")
        assert page.is_visible("[data-testid=admin-link]") and page.is_visible("[data-testid=docs-link]")
        assert page.get_attribute("[data-testid=admin-link]", "href") == "/admin/"
        assert page.get_attribute("[data-testid=docs-link]", "href") == "/docs"
        if phone:
            page.keyboard.press("Escape")
        chat_models = options_of(page)
        assert TINY_WHISPER not in chat_models and TINY_VLM in chat_models and TINY_MODEL in chat_models
        assert page.input_value("[data-model-select]") == TINY_MODEL  # the server's default, not the first by name
        assert "text" in page.inner_text("[data-model-select] option:checked")
        assert page.is_disabled("#attach")
        assert "text only" in page.inner_text("#attach-why")
        chat_settings(page, temperature=0, max_tokens=6)
        send_message(page, "Hello there")
        wait_for_answer(page)
        assert page.is_hidden("#error"), page.inner_text("#error")
        assert page.locator(".message.assistant").count() == 1
        page.wait_for_function("() => /\\d+ \\/ \\d+ tokens/.test(document.getElementById('context-meter').textContent)")
        screenshot(page, f"first-run-chat-{width}")

        page.goto(f"{first_run_server.base_url}/playground")
        page.wait_for_selector("body[data-ready=true]")
        assert TINY_WHISPER not in options_of(page)
        assert page.input_value("[data-model-select]") == TINY_MODEL
        page.fill("#max-tokens", "4")
        page.fill("#temperature", "0")
        page.click("#doc")
        page.keyboard.type("Once")
        page.click("#continue")
        wait_for_continuation(page)
        assert page.is_hidden("#error"), page.inner_text("#error")
        assert len(doc_text(page)) > len("Once")
        assert errors == []
    finally:
        context.close()


def test_a_user_in_no_team_is_told_what_to_do(chromium, first_run_server):
    context = chromium.new_context()
    page = context.new_page()
    try:
        log_in(page, first_run_server, "newcomer")
        assert "no team" in page.inner_text("#no-team")
        page.wait_for_selector("#error:not([hidden])")
        assert "administrator" in page.inner_text("#error")
        assert "Loading" not in page.inner_text("[data-model-select]")
        assert not page.is_visible("[data-testid=admin-link]")
    finally:
        context.close()


def test_a_pasted_image_reaches_the_vision_model_as_through_the_sdk(chromium, first_run_server):
    context = chromium.new_context()
    page = context.new_page()
    try:
        log_in(page, first_run_server, "root")
        page.select_option("[data-model-select]", TINY_VLM)
        page.wait_for_selector("#attach:not([disabled])", state="attached")
        page.evaluate(PASTE_IMAGE)
        page.wait_for_selector("#attachments img.thumb")
        chat_settings(page, temperature=0, max_tokens=8)
        send_message(page, "What is in this picture?")
        wait_for_answer(page)
        assert page.is_hidden("#error"), page.inner_text("#error")
        assert page.locator(".message.user img.thumb").count() == 1
        stored = stored_conversation(page, first_run_server, conversation_id(page)).json()
        question, answer = stored["messages"]
        image_url = question["content"][1]["image_url"]["url"]
        assert image_url.startswith("data:image/png;base64,")
        client = OpenAI(base_url=f"{first_run_server.base_url}/v1", api_key=first_run_server.key, max_retries=0,
                        timeout=120)
        expected = client.chat.completions.create(model=TINY_VLM, temperature=0, max_tokens=8, messages=[
            {"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                         {"type": "image_url", "image_url": {"url": image_url}}]}])
        assert answer["content"] == expected.choices[0].message.content
        screenshot(page, "chat-image")

        # A text-only model greys the button out, and a message with an image is not sent to it.
        page.select_option("[data-model-select]", TINY_MODEL)
        assert page.is_disabled("#attach")
    finally:
        context.close()
