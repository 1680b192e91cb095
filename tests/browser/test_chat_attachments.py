"""Audio and video attachments end to end in real Chromium, with the tiny audio-language and vision models:
a WAV dropped on the composer and a video pasted into the box reach the model exactly as the same request
through the SDK does; Regenerate and Edit send them again; a tab closed mid-answer keeps the partial answer."""
from __future__ import annotations

import base64

import pytest
from openai import OpenAI

from .. import media_files
from ..conftest import TINY_AUDIO_LM, TINY_MODEL, TINY_VLM
from .conftest import screenshot, signed_in
from .pages import chat_settings, conversation_id, send_message, stored_conversation, wait_for_answer

# A file handed to the page as the browser hands over a dropped or pasted one: a File in a DataTransfer.
GIVE_FILE = """async ({event, target, name, type, data}) => {
    const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
    const transfer = new DataTransfer();
    transfer.items.add(new File([bytes], name, {type}));
    const node = document.querySelector(target);
    if (event === 'paste') {
        node.dispatchEvent(new ClipboardEvent('paste', {clipboardData: transfer, bubbles: true, cancelable: true}));
    } else {
        for (const kind of ['dragenter', 'dragover', 'drop']) {
            node.dispatchEvent(new DragEvent(kind, {dataTransfer: transfer, bubbles: true, cancelable: true}));
        }
    }
}"""


@pytest.fixture
def root_page(chromium, media_pages_server):
    with signed_in(chromium, media_pages_server, "root") as page:
        yield page


def send_with_file(page, model: str, event: str, file: tuple[str, str, bytes], question: str,
                   shown: str) -> list[dict]:
    """Choose the model, give the page the file (name, type, bytes) by a drop on the composer or a paste into
    the box, wait for its `shown` element among the attachments, send the question and wait for the answer.
    Returns the bodies of the page's /v1/chat/completions requests, this one and those after it."""
    page.select_option("[data-model-select]", model)
    page.wait_for_selector("#attach:not([disabled])", state="attached")
    name, media_type, data = file
    page.evaluate(GIVE_FILE, {"event": event, "target": "#prompt" if event == "paste" else "#composer",
                              "name": name, "type": media_type, "data": base64.b64encode(data).decode()})
    page.wait_for_selector(f"#attachments {shown}")
    chat_settings(page, temperature=0, max_tokens=8)
    bodies: list[dict] = []
    page.on("request", lambda request: request.url.endswith("/v1/chat/completions") and bodies.append(
        request.post_data_json))
    send_message(page, question)
    wait_for_answer(page)
    assert page.is_hidden("#error"), page.inner_text("#error")
    return bodies


def sdk_answer(server, model: str, question: dict) -> str:
    client = OpenAI(base_url=f"{server.base_url}/v1", api_key=server.key, max_retries=0, timeout=120)
    parts = [{k: v for k, v in part.items() if k != "name"} for part in question["content"]]
    return client.chat.completions.create(model=model, temperature=0, max_tokens=8, messages=[
        {"role": "user", "content": parts}]).choices[0].message.content


def test_a_dropped_wav_reaches_the_audio_model_and_regenerate_sends_it_again(root_page, media_pages_server):
    page = root_page
    wav = media_files.wav_bytes(media_files.tone(0.5, 440))
    bodies = send_with_file(page, TINY_AUDIO_LM, "drop", ("tone.wav", "audio/wav", wav), "What is this sound?", "audio")
    assert "audio/wav" in page.get_attribute("#attach", "accept")
    assert page.locator(".message.user audio").count() == 1
    question, answer = stored_conversation(page, media_pages_server, conversation_id(page)).json()["messages"]
    sent = question["content"][1]["input_audio"]
    assert sent == {"data": base64.b64encode(wav).decode(), "format": "wav"}
    assert answer["content"] == sdk_answer(media_pages_server, TINY_AUDIO_LM, question)

    # Regenerate sends the audio again (the same request: the same greedy answer, as a second version).
    page.click(".message.assistant button:text('Regenerate')")
    page.wait_for_selector(".message.assistant .versions .count:text('2/2')")
    wait_for_answer(page)
    assert [body["messages"][-1]["content"][1] for body in bodies] == [{"type": "input_audio", "input_audio": sent}] * 2
    assert page.inner_text(".message.assistant .body") == answer["content"].strip()
    screenshot(page, "chat-audio")
    assert page.js_errors == []


def test_a_pasted_video_reaches_the_vision_model_and_edit_sends_it_again(root_page, media_pages_server):
    page = root_page
    video = media_files.lossless_video_bytes(media_files.video_frames(8))
    bodies = send_with_file(page, TINY_VLM, "paste", ("clip.mkv", "video/x-matroska", video), "What happens here?",
                            "video")
    question, answer = stored_conversation(page, media_pages_server, conversation_id(page)).json()["messages"]
    url = question["content"][1]["video_url"]["url"]
    assert url == "data:video/x-matroska;base64," + base64.b64encode(video).decode()
    assert answer["content"] == sdk_answer(media_pages_server, TINY_VLM, question)

    # Edit the question: the video goes with the edited text.
    page.click(".message.user button:text('Edit')")
    page.fill(".message.user textarea", "And what happens now?")
    page.click(".message.user button:text('Save & send')")
    page.wait_for_selector(".message.user .versions .count:text('2/2')")
    wait_for_answer(page)
    assert page.is_hidden("#error"), page.inner_text("#error")
    edited = bodies[-1]["messages"][-1]["content"]
    assert edited == [{"type": "text", "text": "And what happens now?"},
                      {"type": "video_url", "video_url": {"url": url}}]
    assert page.locator(".message.user video").count() == 1
    assert page.js_errors == []


def test_a_tab_closed_mid_answer_keeps_the_partial_answer(chromium, media_pages_server):
    with signed_in(chromium, media_pages_server, "root") as page:
        page.select_option("[data-model-select]", TINY_MODEL)
        chat_settings(page, temperature=0, max_tokens=200)
        cdp = page.context.new_cdp_session(page)  # a slow link: the answer is still streaming when the tab goes
        cdp.send("Network.enable")
        cdp.send("Network.emulateNetworkConditions",
                 {"offline": False, "latency": 0, "downloadThroughput": 3000, "uploadThroughput": -1})
        send_message(page, "Tell me a long story")
        page.wait_for_function("() => (document.querySelector('.message.assistant.streaming .body')"
                               "?.textContent || '').length > 3", timeout=60_000)
        conversation = conversation_id(page)
        shown = page.evaluate("() => document.querySelector('.message.assistant.streaming .body').textContent")
        page.close(run_before_unload=True)
        # Saved by the request that outlived the tab, or else from this browser's outbox at the next visit.
        again = page.context.new_page()
        again.goto(f"{media_pages_server.base_url}/chat?c={conversation}")
        again.wait_for_selector("body[data-ready=true]")
        messages = stored_conversation(again, media_pages_server, conversation).json()["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant"]
        assert messages[1]["content"].strip().startswith(shown.strip())
        assert messages[1]["stats"]["finish_reason"] == "stopped"
        assert again.locator(".message.assistant").count() == 1
