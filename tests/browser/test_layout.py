"""The layout in real Chromium: a phone gives the messages the screen (one row of bar, one of toolbar, a
compact composer) at 390×844, a desktop keeps everything in view at 1280×800, light and dark (the
screenshots docs/browser.md shows); and the smaller finishes: whole model names in compare mode, whole
conversation titles, the playground's settings across a reload, a favicon, quotes and code labels."""
from __future__ import annotations

import pytest

from ..conftest import TINY_MODEL
from .conftest import SECOND_MODEL, screenshot
from .pages import ANSWER, store_conversation

SIZES = {"desktop": (1280, 800), "phone": (390, 844)}


def open_reading(page, server) -> None:
    conversation = store_conversation(page, server, {"title": "Reading an answer", "model": TINY_MODEL, "messages": [
        {"role": "user", "content": "Show me maths and code"},
        {"role": "assistant", "content": ANSWER, "stats": {"model": TINY_MODEL, "finish_reason": "length"}},
    ]})
    page.goto(f"{server.base_url}/chat?c={conversation}")
    page.wait_for_selector("body[data-ready=true]")
    page.wait_for_selector(".message.assistant .katex")


def rows_of(page, selector: str) -> int:
    """How many rows the visible items of `selector` make: their vertical centres, apart by more than 12 px
    (the bar's items are centred in their row; `display: contents` boxes count by their children)."""
    centres = page.evaluate("""(selector) => {
        const items = (node) => [...node.children].flatMap((child) =>
            getComputedStyle(child).display === 'contents' ? items(child) : [child]);
        return items(document.querySelector(selector)).filter((n) => n.checkVisibility())
            .map((n) => { const box = n.getBoundingClientRect(); return box.top + box.height / 2; })
            .sort((a, b) => a - b);
    }""", selector)
    return 1 + sum(1 for a, b in zip(centres, centres[1:]) if b - a > 12)


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("size", SIZES)
def test_the_messages_get_the_screen_and_everything_stays_reachable(page_of, web_server, size, scheme):
    width, height = SIZES[size]
    page = page_of("sam", width=width, height=height)
    page.emulate_media(color_scheme=scheme)
    open_reading(page, web_server)
    assert rows_of(page, ".topbar") == 1
    assert rows_of(page, ".toolbar") == 1
    messages = page.locator("#messages").bounding_box()["height"]
    screenshot(page, f"chat-{width}x{height}-{scheme}")
    if size == "phone":
        assert messages >= 0.75 * height, messages
        assert page.is_hidden("[data-testid=admin-link]")
        page.click("#menu-toggle")  # the staff links, the theme and Log out are one tap away
        assert page.is_visible("[data-testid=admin-link]") and page.is_visible("#theme-toggle")
        page.keyboard.press("Escape")
        assert page.is_hidden("[data-testid=admin-link]")
        assert page.evaluate("() => document.activeElement.id") == "menu-toggle"
    else:
        assert messages >= 0.7 * height, messages
        assert page.is_visible("[data-testid=admin-link]") and page.is_hidden("#menu-toggle")
    assert page.js_errors == []


def test_quotes_have_a_bar_and_code_blocks_their_language(page_of, web_server):
    page = page_of("alice")
    open_reading(page, web_server)
    quote = page.locator(".message.assistant blockquote")
    assert "quoted line" in quote.inner_text()
    assert float(quote.evaluate("(q) => parseFloat(getComputedStyle(q).borderLeftWidth)")) >= 2
    assert page.locator(".message.assistant .code-wrap .code-lang").all_inner_texts() == ["python"]


def test_conversation_titles_are_not_cut_by_their_buttons(page_of, web_server):
    page = page_of("bob")
    titles = ["Notes on the harbour walls", "Questions about the ferries"]
    for title in titles:
        store_conversation(page, web_server, {"title": title, "model": SECOND_MODEL, "messages": [
            {"role": "user", "content": title}]})
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    page.mouse.move(900, 400)  # the pointer away from the list
    for title in titles:
        button = page.locator("#conversation-list .open", has_text=title)
        assert button.evaluate("(b) => b.scrollWidth <= b.clientWidth"), title
    # Rename and Delete are there for the pointer and the keyboard.
    item = page.locator("#conversation-list li", has_text=titles[0])
    item.hover()
    assert item.locator("button:text('Rename')").is_visible()
    page.mouse.move(900, 400)
    item.locator(".open").focus()
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.textContent") == "Rename"


def test_compare_names_are_whole_and_the_sampling_settings_are_kept(page_of, web_server):
    page = page_of("dana", width=390, height=844)
    page.goto(f"{web_server.base_url}/playground")
    page.wait_for_selector("body[data-ready=true]")
    page.click("#compare summary")
    page.wait_for_selector("#compare-models input")
    for label in page.locator("#compare-models label").all():
        lines = label.evaluate("(l) => l.querySelector('.name').getClientRects().length")
        height = label.bounding_box()["height"]
        assert lines == 1 and height < 30, (label.inner_text(), height)
    values = {"#max-tokens": "7", "#temperature": "0.3", "#top-p": "0.9", "#top-k": "5", "#seed": "42",
              "#stop-strings": "END\nSTOP"}
    for selector, value in values.items():
        page.fill(selector, value)
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    assert {selector: page.input_value(selector) for selector in values} == values


def test_every_page_finds_its_favicon(page_of, web_server):
    page = page_of("sam")
    missing: list[str] = []
    page.on("response", lambda response: response.status == 404 and missing.append(response.url))
    for path in ("/chat", "/playground", "/account", "/admin/", "/docs"):
        page.goto(f"{web_server.base_url}{path}")
        page.wait_for_load_state("networkidle")
    icon = page.request.get(f"{web_server.base_url}/favicon.ico")
    assert icon.status == 200 and icon.headers["content-type"] == "image/x-icon" and icon.body()[:4] == b"\0\0\1\0"
    assert missing == []
