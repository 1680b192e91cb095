"""Accessibility in real Chromium: axe-core (vendored, tests/browser/vendor/) finds nothing on the pages and the
admin's catalog, light and dark; a skip link takes the keyboard to the message box at once; focus goes back
to where it was when the phone drawer closes."""
from __future__ import annotations

import json

import pytest

from ..conftest import TINY_MODEL
from .pages import ANSWER, axe_violations, csrf_header, store_conversation

PAGES = {"/chat": "body[data-ready=true]", "/playground": "body[data-ready=true]", "/account": "body[data-ready=true]",
         "/admin/catalog/cachedmodel/": "#result_list"}
# The playground's document with a token of each colour, from likely (green) to unlikely (red).
TOKENS = [{"kind": "token", "text": f" w{i}", "logprob": logprob, "top": [[f" w{i}", logprob]]}
          for i, logprob in enumerate([0, -0.1, -0.3, -0.7, -1.2, -2, -4, -8])]


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_axe_finds_no_violation_on_any_page(page_of, web_server, scheme):
    page = page_of("sam")
    page.emulate_media(color_scheme=scheme)
    # Something on each page: an answer with code, maths, a table and a quote; tokens; a key.
    conversation = store_conversation(page, web_server, {"title": "Look", "model": TINY_MODEL, "messages": [
        {"role": "user", "content": "Show me"},
        {"role": "assistant", "content": ANSWER, "stats": {"model": TINY_MODEL, "finish_reason": "length"}},
    ]})
    page.evaluate("(doc) => localStorage.setItem('playground.doc', JSON.stringify(doc))", TOKENS)
    page.request.post(f"{web_server.base_url}/ui/api/keys", headers=csrf_header(page), data=json.dumps({"name": "axe"}))
    found = {}
    for path, ready in PAGES.items():
        page.goto(f"{web_server.base_url}{path}" + (f"?c={conversation}" if path == "/chat" else ""))
        page.wait_for_selector(ready)
        found[path] = axe_violations(page)
    assert page.locator("#result_list tbody tr").count() >= 2
    page.goto(f"{web_server.base_url}/playground")
    page.wait_for_selector("body[data-ready=true]")
    assert page.locator("#doc .tok").count() == len(TOKENS)
    assert found == {path: [] for path in PAGES}
    assert page.js_errors == []


@pytest.mark.parametrize(("path", "target"), [("/chat", "prompt"), ("/playground", "doc")])
def test_a_skip_link_reaches_the_main_control_in_one_tab(page_of, web_server, path, target):
    page = page_of("alice")
    page.goto(f"{web_server.base_url}{path}")
    page.wait_for_selector("body[data-ready=true]")
    page.evaluate("() => document.activeElement.blur()")
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.className") == "skip-link"
    box = page.locator(".skip-link").bounding_box()
    assert box["y"] >= 0 and box["height"] > 0  # seen while it has focus
    page.keyboard.press("Enter")
    assert page.evaluate("() => document.activeElement.id") == target
    page.keyboard.type("typed at once")
    assert "typed at once" in page.evaluate(f"() => document.getElementById('{target}').value "
                                            f"?? document.getElementById('{target}').textContent")


def test_the_closed_phone_drawer_gives_focus_back_and_takes_no_tab(page_of):
    page = page_of("alice", width=390, height=844)
    page.click("#sidebar-toggle")
    page.wait_for_selector("#sidebar.open")
    assert page.evaluate("() => document.activeElement.id") == "search"
    page.keyboard.press("Escape")
    page.wait_for_selector("#sidebar:not(.open)")
    assert page.evaluate("() => document.activeElement.id") == "sidebar-toggle"
    page.wait_for_function("() => getComputedStyle(document.getElementById('sidebar')).visibility === 'hidden'")
    # Tab from the toggle never goes into the closed drawer.
    for _ in range(12):
        page.keyboard.press("Tab")
        assert not page.evaluate("() => document.getElementById('sidebar').contains(document.activeElement)")
