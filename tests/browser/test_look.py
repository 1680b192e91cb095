"""How the pages look and read: dark mode (system and toggle) with enough contrast, code and math, the phone drawer."""
from __future__ import annotations

import json

import pytest

from ..conftest import TINY_MODEL
from .conftest import screenshot
from .pages import ANSWER, low_contrast, store_conversation


@pytest.fixture
def shown_conversation(page_of, web_server):
    def show(scheme: str, width: int = 1200):
        page = page_of("alice", width=width)
        page.emulate_media(color_scheme=scheme)
        conversation = store_conversation(page, web_server, {"title": "Look", "model": TINY_MODEL, "messages": [
            {"role": "user", "content": "Show me maths and code"},
            {"role": "assistant", "content": ANSWER,
             "stats": {"model": TINY_MODEL, "seconds": 1.0, "finish_reason": "length"}},
        ]})
        page.goto(f"{web_server.base_url}/chat?c={conversation}")
        page.wait_for_selector("body[data-ready=true]")
        page.wait_for_selector(".message.assistant .katex")
        return page
    return show


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_pages_follow_the_colour_scheme_with_readable_contrast(shown_conversation, web_server, scheme):
    page = shown_conversation(scheme)
    background = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
    dark = sum(map(int, background[4:-1].split(",")[:3])) < 3 * 80
    assert dark == (scheme == "dark"), background
    assert low_contrast(page) == []
    screenshot(page, f"chat-{scheme}")
    for path in ("/playground", "/account"):
        page.goto(f"{web_server.base_url}{path}")
        page.wait_for_selector("body[data-ready=true]") if path == "/playground" else page.wait_for_load_state()
        assert low_contrast(page) == [], path
        screenshot(page, f"{path.strip('/')}-{scheme}")


def test_the_theme_toggle_is_remembered(page_of, web_server):
    page = page_of("alice")
    page.emulate_media(color_scheme="light")
    assert page.inner_text("#theme-toggle") == "Theme: system"
    page.click("#theme-toggle")  # system -> dark
    assert page.get_attribute("html", "data-theme") == "dark"
    assert low_contrast(page) == []
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    assert page.get_attribute("html", "data-theme") == "dark"
    assert page.inner_text("#theme-toggle") == "Theme: dark"
    page.click("#theme-toggle")  # dark -> light
    page.click("#theme-toggle")  # light -> system
    assert page.get_attribute("html", "data-theme") is None


def test_code_is_highlighted_and_copied_and_math_rendered(shown_conversation):
    page = shown_conversation("light")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    answer = page.locator(".message.assistant")
    assert answer.locator(".katex").count() == 4  # $…$, $$…$$, \\(…\\), \\[…\\]
    assert answer.locator(".katex-display").count() == 2
    assert "e^{i\\pi}+1=0" in answer.locator(".katex annotation").first.text_content()
    assert "$" not in answer.locator(".body").inner_text().replace("$$", "")
    assert answer.locator("pre code .hljs-keyword").count() >= 1
    assert answer.locator("pre code .hljs-comment").count() == 1
    assert answer.locator("table td").count() == 2
    answer.locator(".copy-code").click()
    assert page.evaluate("() => navigator.clipboard.readText()") == 'def greet(name):\n    return "hello " + name  # a comment\n'
    assert answer.locator(".copy-code").inner_text() == "Copied"
    answer.locator(".meta button:text('Copy')").click()
    assert page.evaluate("() => navigator.clipboard.readText()") == ANSWER
    assert answer.locator(".meta button:text('Continue')").count() == 1  # cut off at max_tokens
    assert page.js_errors == []
    screenshot(page, "chat-code-math")


def test_the_phone_drawer_closes_by_button_backdrop_and_escape(page_of):
    page = page_of("alice", width=390, height=844)
    for close in ("button", "backdrop", "escape"):
        page.click("#sidebar-toggle")
        page.wait_for_selector("#sidebar.open")
        assert page.is_visible("#sidebar-backdrop")
        if close == "button":
            page.click("#sidebar-close")
        elif close == "backdrop":
            page.mouse.click(370, 400)
        else:
            page.keyboard.press("Escape")
        page.wait_for_selector("#sidebar:not(.open)")
        assert page.is_hidden("#sidebar-backdrop")
        assert page.get_attribute("#sidebar-toggle", "aria-expanded") == "false"
    screenshot(page, "chat-390px")


def test_search_export_and_import(page_of, web_server, tmp_path):
    page = page_of("bob")
    for title in ("Gardening notes", "Tax questions"):
        store_conversation(page, web_server, {"title": title, "model": "local/tiny-llama-b", "system_prompt": "Be brief.",
                                              "messages": [{"role": "user", "content": f"About {title}"},
                                                           {"role": "assistant", "content": "**Sure.**"}]})
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    page.fill("#search", "garden")
    assert page.locator("#conversation-list .open").all_inner_texts() == ["Gardening notes"]
    page.click("#conversation-list .open")
    page.wait_for_selector(".message.assistant")
    with page.expect_download() as download:
        page.click("#export-json")
    exported = json.loads(download.value.path().read_text())
    assert exported["messages"] == [{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "About Gardening notes"},
                                    {"role": "assistant", "content": "**Sure.**"}]
    with page.expect_download() as download:
        page.click("#export-md")
    markdown = download.value.path().read_text()
    assert "## User\n\nAbout Gardening notes" in markdown and "## Assistant\n\n**Sure.**" in markdown

    path = tmp_path / "imported.json"
    path.write_text(json.dumps({**exported, "title": "Imported garden"}))
    page.set_input_files("#import", str(path))
    page.wait_for_selector("#conversation-list .open:text('Imported garden')")
    page.wait_for_function("() => document.querySelectorAll('.message').length === 2")
    assert page.input_value("#system-prompt") == "Be brief."
