"""/playground in real Chromium: a base model continues the text in place, token probabilities shown."""
from __future__ import annotations

import json
import time

import pytest
from openai import OpenAI

from ..conftest import TINY_MODEL
from .conftest import SECOND_MODEL, screenshot
from .pages import DONE_TIMEOUT_MS, doc_text, playground_settings, popover_alternatives, wait_for_continuation

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
    colours = tokens.evaluate_all("spans => spans.map(s => getComputedStyle(s).backgroundColor)")
    # A colour mixed from the palette (color-mix may compute to rgb() or color(srgb ...)), never transparent.
    assert all(colour.startswith(("rgb", "color(")) and colour != "rgba(0, 0, 0, 0)" for colour in colours), colours

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


def test_the_document_survives_a_reload_and_tokens_are_reachable_by_keyboard(page_of, web_server):
    page = open_playground(page_of, web_server)
    playground_settings(page, temperature=0, max_tokens=6)
    page.click("#clear")
    page.click("#doc")
    page.keyboard.type("Keep me")
    page.click("#continue")
    wait_for_continuation(page)
    text = doc_text(page)
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    assert doc_text(page) == text
    assert page.locator("#doc .tok").count() >= 1  # the token colours come back too

    page.click("#doc")
    page.keyboard.press("Alt+ArrowRight")  # to the first token: its alternatives show
    shown = popover_alternatives(page)
    assert page.locator("#doc .tok.active").count() == 1
    page.keyboard.press("Alt+ArrowDown")
    assert page.evaluate("() => document.activeElement.classList.contains('alt')")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")  # the second alternative: cut there, put in, continue
    wait_for_continuation(page)
    if not shown[1][0].startswith("bytes:"):
        assert doc_text(page).startswith("Keep me" + shown[1][0])

    page.click("#view-code summary")
    assert '"model": "local/tiny-llama"' in page.inner_text("#code-curl")
    assert "client.completions.create(" in page.inner_text("#code-python")
    assert 'prompt="Keep me' in page.inner_text("#code-python")
    curl = page.evaluate("() => document.getElementById('code-curl').textContent")
    body = curl.split("-d '", 1)[1].rsplit("'", 1)[0].replace("'\\''", "'")
    assert json.loads(body)["prompt"] == doc_text(page)


def test_compare_mode_continues_and_scores_under_two_models(page_of, web_server):
    page = page_of("dana")
    page.goto(f"{web_server.base_url}/playground")
    page.wait_for_selector("body[data-ready=true]")
    playground_settings(page, temperature=0.8, max_tokens=8)
    page.fill("#seed", "7")
    page.click("#doc")
    page.keyboard.type(PROMPT)
    page.click("#compare summary")
    page.wait_for_selector(f"#compare-models input[value='{SECOND_MODEL}']")
    page.check(f"#compare-models input[value='{TINY_MODEL}']")
    page.check(f"#compare-models input[value='{SECOND_MODEL}']")
    page.click("#compare-run")
    page.wait_for_selector(".compare-column >> nth=1", timeout=DONE_TIMEOUT_MS)
    client = OpenAI(base_url=f"{web_server.base_url}/v1", api_key=web_server.key, max_retries=0, timeout=120)
    for model in (TINY_MODEL, SECOND_MODEL):
        expected = client.completions.create(model=model, prompt=PROMPT, temperature=0.8, max_tokens=8, seed=7).choices[0]
        column = page.locator(f".compare-column[data-model='{model}'] .compare-doc")
        assert column.inner_text() == PROMPT + expected.text
        assert column.locator(".tok").count() >= 1

    page.click("#compare-score")
    page.wait_for_selector(f".compare-column[data-model='{SECOND_MODEL}'] .tok[data-delta]", timeout=DONE_TIMEOUT_MS)
    scores = {model: client.completions.create(model=model, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
              .choices[0].logprobs.token_logprobs for model in (TINY_MODEL, SECOND_MODEL)}
    deltas = page.eval_on_selector_all(f".compare-column[data-model='{SECOND_MODEL}'] .tok[data-delta]",
                                       "spans => spans.map(s => Number(s.dataset.delta))")
    expected_deltas = [b - a for a, b in zip(scores[TINY_MODEL], scores[SECOND_MODEL]) if a is not None]
    assert deltas == pytest.approx(expected_deltas, abs=1e-4)
    total = float(page.get_attribute(f".compare-column[data-model='{SECOND_MODEL}']", "data-total"))
    assert total == pytest.approx(sum(lp for lp in scores[SECOND_MODEL] if lp is not None), abs=1e-3)
    assert page.js_errors == []
    screenshot(page, "playground-compare")


def test_a_text_longer_than_the_context_is_continued_from_its_end(page_of, web_server):
    """The rolling window for the document: its start is left out of the request (said under the text), the
    model continues from its last tokens, and the request is the same as the API's with those token ids."""
    page = page_of("alice")
    page.goto(f"{web_server.base_url}/playground")
    page.wait_for_selector("body[data-ready=true]")
    playground_settings(page, temperature=0, max_tokens=8)
    text = " ".join(f"line{i} of a long text" for i in range(200))  # well over the tiny model's 512 tokens
    page.click("#doc")
    page.keyboard.insert_text(text)
    statuses: list[int] = []
    page.on("response", lambda response: response.url.endswith("/v1/completions") and statuses.append(response.status))

    def requests_counted() -> int:
        return page.request.get(f"{web_server.base_url}/v1/key").json()["data"]["period_requests"]

    counted_before = requests_counted()
    with page.expect_request(lambda request: request.url.endswith("/v1/completions")) as sent:
        page.click("#continue")
    wait_for_continuation(page)
    assert statuses == [200]
    assert page.is_hidden("#error"), page.inner_text("#error")
    body = json.loads(sent.value.post_data)
    assert isinstance(body["prompt"], list) and body["prompt"] and len(body["prompt"]) + body["max_tokens"] <= 512
    assert body["max_tokens"] == 8
    stats = page.inner_text("#stats")
    assert "not sent: beyond the context" in stats, stats
    assert int(page.get_attribute("body", "data-not-sent-chars")) > 0
    continued = doc_text(page)
    assert continued.startswith(text) and len(continued) > len(text)
    # Only the continuation was a request of the team's: neither /tokenize nor /detokenize from the page.
    deadline = time.monotonic() + 10
    while requests_counted() < counted_before + 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)
    assert requests_counted() == counted_before + 1
    # The same continuation as the API gives for those token ids.
    assert continued[len(text):] == completion(web_server, body["prompt"], max_tokens=8).text
    assert page.js_errors == []
