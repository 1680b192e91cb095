"""Attachments through the Attach button, and the per-user storage bound, in real Chromium.

A server of this module's own: the media cache (a text, a vision-language and a speech model) and a
small `INFERENCE_UI_STORAGE_BYTES_PER_USER`, so that one long message passes it.
"""
from __future__ import annotations

import io
import json

import pytest
from openai import OpenAI
from PIL import Image

from ..conftest import TINY_MODEL, TINY_VLM
from .conftest import media_page_server, screenshot, signed_in
from .pages import chat_settings, conversation_id, csrf_header, send_message, stored_conversation, wait_for_answer

STORAGE_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def media_server(media_cache, tmp_path_factory):
    live = media_page_server(media_cache, tmp_path_factory.mktemp("chat-media"), "chat-media",
                             INFERENCE_UI_STORAGE_BYTES_PER_USER=str(STORAGE_BYTES))
    yield live
    live.stop()


@pytest.fixture
def root_page(chromium, media_server):
    with signed_in(chromium, media_server, "root") as page:
        yield page


def squares_png(path) -> None:
    image = Image.new("RGB", (32, 24), (200, 50, 50))
    image.paste((50, 200, 50), (8, 4, 20, 14))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    path.write_bytes(buffer.getvalue())


def test_the_attach_button_sends_an_image_to_the_vision_model_and_is_greyed_out_for_text(root_page, media_server,
                                                                                            tmp_path):
    page = root_page
    # A text-only model: the button is greyed out, and the page says why.
    page.select_option("[data-model-select]", TINY_MODEL)
    assert page.is_disabled("#attach")
    assert "disabled" in page.get_attribute("#attach-label", "class")
    assert page.inner_text("#attach-why") == f"{TINY_MODEL} takes text only: no attachments."

    page.select_option("[data-model-select]", TINY_VLM)
    page.wait_for_selector("#attach:not([disabled])", state="attached")
    assert page.inner_text("#attach-why") == ""
    assert "image/*" in page.get_attribute("#attach", "accept")
    image = tmp_path / "squares.png"
    squares_png(image)
    page.set_input_files("#attach", str(image))
    page.wait_for_selector("#attachments img.thumb")
    chat_settings(page, temperature=0, max_tokens=8)
    send_message(page, "What is in this picture?")
    wait_for_answer(page)
    assert page.is_hidden("#error"), page.inner_text("#error")
    assert page.locator(".message.user img.thumb").count() == 1
    assert page.locator("#attachments .attachment").count() == 0  # sent: the box is empty again
    stored = stored_conversation(page, media_server, conversation_id(page)).json()
    question, answer = stored["messages"]
    image_url = question["content"][1]["image_url"]["url"]
    assert image_url.startswith("data:image/png;base64,")
    client = OpenAI(base_url=f"{media_server.base_url}/v1", api_key=media_server.key, max_retries=0, timeout=120)
    expected = client.chat.completions.create(model=TINY_VLM, temperature=0, max_tokens=8, messages=[
        {"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                     {"type": "image_url", "image_url": {"url": image_url}}]}])
    assert answer["content"] == expected.choices[0].message.content
    screenshot(page, "chat-attach")
    assert page.js_errors == []


def test_the_storage_bound_answers_413_and_the_message_stays_in_the_box(root_page, media_server):
    page = root_page
    # The JSON API: a conversation past the bound is refused as such.
    big = "x" * (STORAGE_BYTES + 1024)
    refused = page.request.post(f"{media_server.base_url}/ui/api/conversations", headers=csrf_header(page),
                                data=json.dumps({"title": "Too big", "model": TINY_MODEL,
                                                 "messages": [{"role": "user", "content": big}]}))
    assert refused.status == 413, refused.text()[:300]
    assert refused.json()["error"]["code"] == "conversation_storage_full"

    # The page: the turn is not saved, so not sent; the text goes back into the box with the reason.
    page.select_option("[data-model-select]", TINY_MODEL)
    chat_settings(page, temperature=0, max_tokens=2)
    send_message(page, "A short question")
    wait_for_answer(page)
    conversation = conversation_id(page)
    # Other conversations fill the bound up to about 500 bytes; the next message (1 kB of text, half of
    # the tiny model's context: it fits the context, so the page sends it) passes the bound.
    listed = page.request.get(f"{media_server.base_url}/ui/api/conversations").json()["data"]
    used = sum(len(json.dumps(stored_conversation(page, media_server, c["id"]).json()["messages"],
                              ensure_ascii=False).encode()) for c in listed)
    filler = page.request.post(f"{media_server.base_url}/ui/api/conversations", headers=csrf_header(page),
                               data=json.dumps({"title": "Filler", "messages": [
                                   {"role": "user", "content": "f" * (STORAGE_BYTES - used - 540)}]}))
    assert filler.status == 201, filler.text()[:300]
    more = "the " * 250
    page.fill("#prompt", more)
    page.press("#prompt", "Enter")
    page.wait_for_selector("#error:not([hidden])")
    assert "delete some" in page.inner_text("#error")
    page.wait_for_selector("body:not([data-busy])")
    assert page.input_value("#prompt") == more
    assert len(stored_conversation(page, media_server, conversation).json()["messages"]) == 2
    assert page.locator(".message.user").count() == 1
    gone = page.request.delete(f"{media_server.base_url}/ui/api/conversations/{filler.json()['id']}",
                               headers=csrf_header(page))
    assert gone.status == 204, gone.text()[:300]
