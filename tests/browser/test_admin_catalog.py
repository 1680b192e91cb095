"""The admin's catalog in real Chromium: Preload and Unload show each model's load live, stage by stage
with its tensors and bytes, as /load_model streams it; the table fits 1280 px beside its filters."""
from __future__ import annotations

from .conftest import SECOND_MODEL, screenshot
from .pages import axe_violations

CHANGELIST = "/admin/catalog/cachedmodel/"
# Every text the row's status cell shows, as it changes.
WATCH_STATUS = """(model) => {
    const cell = document.querySelector(`.model-status[data-model="${model}"]`).closest('td');
    window.statusSeen = [];
    new MutationObserver(() => window.statusSeen.push(cell.textContent.trim()))
        .observe(cell, {subtree: true, childList: true, characterData: true});
}"""


def run_action(page, action: str, model: str) -> None:
    page.locator("#result_list tbody tr", has=page.locator(f'.model-status[data-model="{model}"]')) \
        .locator("input.action-select").check()
    page.select_option("select[name=action]", action)
    page.click("button[name=index]")


def status_of(page, model: str) -> str:
    return page.inner_text(f'.model-status[data-model="{model}"]')


def test_preload_and_unload_show_live_progress_and_the_table_fits(page_of, web_server):
    page = page_of("sam", width=1280, height=800)
    page.goto(f"{web_server.base_url}{CHANGELIST}")
    page.wait_for_selector("#result_list")
    # Every column in view, none under the filter panel.
    filters = page.locator("#changelist-filter").bounding_box()
    for header in page.locator("#result_list thead th").all():
        box = header.bounding_box()
        assert box["x"] + box["width"] <= filters["x"], header.inner_text()

    # Unload first (another test may have loaded it): the row says so, and the page stays.
    run_action(page, "unload_now", SECOND_MODEL)
    page.wait_for_selector("ul.messagelist.live li")
    assert SECOND_MODEL in page.inner_text("ul.messagelist.live")
    page.wait_for_function(f"() => document.querySelector('.model-status[data-model=\"{SECOND_MODEL}\"]')"
                           "?.textContent === 'cached'")

    page.evaluate(WATCH_STATUS, SECOND_MODEL)
    run_action(page, "preload_now", SECOND_MODEL)
    page.wait_for_function(f"() => document.querySelector('.model-status[data-model=\"{SECOND_MODEL}\"]')"
                           "?.textContent === 'loaded'", timeout=120_000)
    seen = page.evaluate("() => window.statusSeen")
    weights = [text for text in seen if text.startswith("weights:")]
    assert weights, seen
    assert any("KB of" in text for text in weights), weights  # bytes, from the row's size
    assert weights[-1].split(",")[0].split()[1].split("/")[0] == weights[-1].split(",")[0].split()[1].split("/")[1]
    assert f"{SECOND_MODEL} loaded in" in page.inner_text("ul.messagelist.live")
    row = page.locator("#result_list tbody tr", has=page.locator(f'.model-status[data-model="{SECOND_MODEL}"]'))
    assert row.locator("td.field-loaded_on").inner_text().strip() not in ("", "-")
    assert axe_violations(page) == []
    screenshot(page, "admin-catalog-1280")
    assert page.js_errors == []
