"""LoRA adapters on /chat and /playground in real Chromium: listed under their base, chosen, answered by the adapter.

A server of this module's own over a cache of the tiny model, two LoRA adapters of it and a tiny
encoder (an embedding model, which cannot chat and so is offered by neither page). Team `lora` may
use the base, both adapters and the encoder; team `plain` the base and one adapter only.
"""
from __future__ import annotations

import json
import shutil

import httpx
import pytest
from openai import OpenAI

from workers.tiny.encoder import build_tiny_encoder
from workers.tiny.lora import build_tiny_lora

from ..conftest import TINY_MODEL
from ..live_server import LiveServer, base_env
from .conftest import MAKE_MEMBERS, PASSWORD, log_in, manage_shell, screenshot
from .pages import (
    chat_settings,
    conversation_id,
    doc_text,
    playground_settings,
    send_message,
    stored_conversation,
    wait_for_answer,
    wait_for_continuation,
)

ADAPTERS = ["local/tiny-lora-a", "local/tiny-lora-b"]
ENCODER = "local/tiny-encoder"
TEAMS = {"lora": {"allowed_models": [TINY_MODEL, *ADAPTERS, ENCODER]},
         "plain": {"allowed_models": [TINY_MODEL, ADAPTERS[1]]}}
MEMBERS = {"ann": "lora", "ben": "plain"}
QUESTION = "Tell me about the sea."
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def adapter_server(hf_cache, tmp_path_factory):
    cache = tmp_path_factory.mktemp("adapter-pages-cache")
    shutil.copytree(hf_cache / "models--local--tiny-llama", cache / "models--local--tiny-llama", symlinks=True)
    for seed, name in enumerate(ADAPTERS, 1):
        build_tiny_lora(name, TINY_MODEL, cache_dir=cache, seed=seed)
    build_tiny_encoder(ENCODER, cache_dir=cache)
    work_dir = tmp_path_factory.mktemp("adapter-pages")
    env = base_env(cache, work_dir, INFERENCE_WORKER_ACK_TIMEOUT="90", INFERENCE_WORKER_LOST_AFTER="90")
    live = LiveServer(env, work_dir, name="adapter-pages")
    live.env = env
    warm_up = httpx.post(f"{live.base_url}/v1/completions", headers=live.headers, timeout=180,
                         json={"model": TINY_MODEL, "prompt": "warm up", "max_tokens": 1})
    assert warm_up.status_code == 200, warm_up.text
    manage_shell(live, MAKE_MEMBERS.format(teams=TEAMS, members=MEMBERS, password=PASSWORD, staff=set(),
                                           superusers=set()))
    yield live
    live.stop()


@pytest.fixture
def page_as(chromium, adapter_server):
    contexts = []

    def open_page(username: str, path: str = "/chat"):
        context = chromium.new_context(viewport={"width": 1200, "height": 800})
        contexts.append(context)
        page = context.new_page()
        page.js_errors = []
        page.on("pageerror", lambda error: page.js_errors.append(str(error)))
        log_in(page, adapter_server, username)
        if path != "/chat":
            page.goto(f"{adapter_server.base_url}{path}")
            page.wait_for_selector("body[data-ready=true]")
        return page

    yield open_page
    for context in contexts:
        context.close()


def sdk(server: LiveServer) -> OpenAI:
    return OpenAI(base_url=f"{server.base_url}/v1", api_key=server.key, max_retries=0, timeout=120)


def picker_options(page) -> list[tuple[str, str]]:
    """The model picker's options as (value, label), in order, once it has filled."""
    page.wait_for_function("() => document.querySelector('[data-model-select]').options[0]?.value")
    return page.eval_on_selector_all("[data-model-select] option", "os => os.map(o => [o.value, o.textContent])")


def test_both_pickers_list_a_teams_adapters_under_their_base_and_no_embedding_model(page_as):
    expected = [TINY_MODEL, *ADAPTERS]
    for path in ("/chat", "/playground"):
        page = page_as("ann", path)
        options = picker_options(page)
        assert [value for value, _ in options] == expected, path  # each adapter right after its base
        labels = dict(options)
        for name in ADAPTERS:
            assert labels[name] == f"{name} · adapter of {TINY_MODEL}"
        assert ENCODER not in labels  # it embeds, it cannot write
        assert page.js_errors == []
    page.click("#compare summary")
    page.wait_for_selector(f"#compare-models input[value='{ADAPTERS[0]}']")
    boxes = page.eval_on_selector_all("#compare-models label", "ls => ls.map(l => [l.querySelector('input').value, l.textContent])")
    assert [value for value, _ in boxes] == expected
    assert dict(boxes)[ADAPTERS[0]] == f"{ADAPTERS[0]} · adapter of {TINY_MODEL}"
    screenshot(page, "playground-adapters")

    for path in ("/chat", "/playground"):  # team plain: only the adapter it may use
        page = page_as("ben", path)
        assert [value for value, _ in picker_options(page)] == [TINY_MODEL, ADAPTERS[1]], path


def test_a_chat_with_an_adapter_streams_the_adapters_answer(page_as, adapter_server):
    page = page_as("ann")
    sent: list[dict] = []
    page.on("request", lambda request: sent.append(json.loads(request.post_data))
            if request.url.endswith("/v1/chat/completions") else None)
    picker_options(page)
    page.select_option("[data-model-select]", ADAPTERS[0])
    chat_settings(page, temperature=0, max_tokens=24)
    send_message(page, QUESTION)
    wait_for_answer(page)
    assert page.is_hidden("#error"), page.inner_text("#error")
    assert [body["model"] for body in sent] == [ADAPTERS[0]] and sent[0]["stream"] is True

    client = sdk(adapter_server)
    answers = {model: client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}],
                                                     temperature=0, max_tokens=24).choices[0].message.content
               for model in (ADAPTERS[0], TINY_MODEL)}
    assert answers[ADAPTERS[0]] != answers[TINY_MODEL]  # else this test could not tell the adapter from its base
    stored = stored_conversation(page, adapter_server, conversation_id(page)).json()
    assert stored["model"] == ADAPTERS[0]
    assert stored["messages"][1]["content"] == answers[ADAPTERS[0]]
    assert page.inner_text(".message.assistant .body").strip() != ""
    screenshot(page, "chat-adapter")

    page.reload()  # the choice is remembered on this page
    page.wait_for_selector("body[data-ready=true]")
    picker_options(page)
    assert page.eval_on_selector("[data-model-select]", "s => s.value") == ADAPTERS[0]
    assert page.js_errors == []


def test_the_playground_continues_with_an_adapter(page_as, adapter_server):
    page = page_as("ben", "/playground")
    picker_options(page)
    page.select_option("[data-model-select]", ADAPTERS[1])
    playground_settings(page, temperature=0, max_tokens=12)
    page.click("#doc")
    page.keyboard.type(PROMPT)
    page.click("#continue")
    wait_for_continuation(page)
    client = sdk(adapter_server)
    texts = {model: client.completions.create(model=model, prompt=PROMPT, temperature=0, max_tokens=12).choices[0].text
             for model in (ADAPTERS[1], TINY_MODEL)}
    assert texts[ADAPTERS[1]] != texts[TINY_MODEL]
    assert doc_text(page) == PROMPT + texts[ADAPTERS[1]]
    assert page.js_errors == []
