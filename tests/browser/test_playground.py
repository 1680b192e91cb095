"""/playground in real Chromium: a base model continues the text in place, token probabilities shown."""
from __future__ import annotations

from openai import OpenAI

from ..conftest import TINY_MODEL
from .conftest import screenshot
from .pages import doc_text, playground_settings, popover_alternatives, wait_for_continuation

PROMPT = "Once upon a time"


def completion(server, prompt: str, **options):
    client = OpenAI(base_url=f"{server.base_url}/v1", api_key=server.key, max_retries=0, timeout=120)
    return client.completions.create(model=TINY_MODEL, prompt=prompt, temperature=0, logprobs=5, **options).choices[0]


def open_playground(page_of, server, width: int = 1200):
    page = page_of("alice", width=width)
    page.goto(f"{server.base_url}/playground")
    page.wait_for_selector("body[data-ready=true]")
    return page


def test_continuation_tokens_are_coloured_with_five_alternatives_and_branch(page_of, web_server):
    page = open_playground(page_of, web_server)
    playground_settings(page, temperature=0, max_tokens=12)
    page.click("#doc")
    page.keyboard.type(PROMPT)
    page.click("#continue")
    wait_for_continuation(page)

    expected = completion(web_server, PROMPT, max_tokens=12)
    assert doc_text(page) == PROMPT + expected.text  # greedy, in place, equal to the API
    tokens = page.locator("#doc .tok")
    assert tokens.count() >= 1
    colours = tokens.evaluate_all("spans => spans.map(s => s.style.backgroundColor)")
    assert all(colour.startswith("rgb") for colour in colours)

    # Hover the first generated token: the API's top 5 there, most likely first.
    first = expected.logprobs.tokens[0]
    assert tokens.nth(0).inner_text() == first
    tokens.nth(0).hover()
    shown = popover_alternatives(page)
    top = sorted(expected.logprobs.top_logprobs[0].items(), key=lambda item: -item[1])[:5]
    assert [token for token, _ in shown] == [token for token, _ in top]
    assert len(shown) == 5
    screenshot(page, "playground")

    # Click the second most likely: the text is cut there, the token put in, and generation goes on.
    alternative = shown[1][0]
    page.locator("#popover .alt").nth(1).click()
    wait_for_continuation(page)
    branched_prompt = PROMPT + alternative
    continuation = completion(web_server, branched_prompt, max_tokens=12)
    assert doc_text(page) == branched_prompt + continuation.text

    # Undo goes back to the text before the branch.
    page.click("#undo")
    assert doc_text(page) == PROMPT + expected.text
    assert page.js_errors == []


def test_scoring_the_text_colours_its_own_tokens(page_of, web_server):
    page = open_playground(page_of, web_server)
    page.click("#doc")
    page.keyboard.type("The cat sat on the mat.")
    page.click("#score")
    page.wait_for_selector("#doc .tok")
    scored = completion(web_server, "The cat sat on the mat.", max_tokens=0, echo=True)
    visible = [t for t, offset, nxt in zip(scored.logprobs.tokens, scored.logprobs.text_offset,
                                           scored.logprobs.text_offset[1:] + [len(scored.text)]) if nxt > offset]
    assert page.locator("#doc .tok").count() == len(visible)
    assert doc_text(page) == "The cat sat on the mat."
    assert "perplexity" in page.inner_text("#stats")
    page.locator("#doc .tok").nth(2).hover()
    assert len(popover_alternatives(page)) == 5
    screenshot(page, "playground-scored")


def test_typing_edits_and_the_playground_fits_a_phone(page_of, web_server):
    page = open_playground(page_of, web_server, width=375)
    playground_settings(page, temperature=0, max_tokens=8)
    page.click("#doc")
    page.keyboard.type("Hello")
    page.click("#continue")
    wait_for_continuation(page)
    generated = doc_text(page)
    page.click("#doc")
    page.keyboard.press("End")
    page.keyboard.press("Control+End")
    page.keyboard.type(" more")
    assert doc_text(page) == generated + " more"
    page.click("#undo")
    assert doc_text(page) == generated
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 375
    page.locator("#doc .tok").nth(0).click()
    popover_alternatives(page)
    screenshot(page, "playground-375px")
