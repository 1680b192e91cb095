"""What the browser tests do on our pages, in one place (selectors live here, not in every test)."""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

from ..live_server import LiveServer

DONE_TIMEOUT_MS = 120_000

# An answer with everything the page draws: maths four ways, a highlighted code block, a table, a link, a quote.
ANSWER = """Euler: $e^{i\\pi}+1=0$ and

$$\\int_0^1 x\\,dx = \\frac{1}{2}$$

also \\(a^2\\) and \\[b^2\\]

```python
def greet(name):
    return "hello " + name  # a comment
```

| a | b |
|---|---|
| 1 | 2 |

**Bold** and `inline code` and a [link](https://example.org).

> A quoted line, with its bar."""


def chat_settings(page, temperature: float | None = None, max_tokens: int | None = None,
                  thinking: str | None = None, tools: str | None = None, overflow: str | None = None) -> None:
    if not page.is_visible("#max-tokens"):
        page.click("#settings summary")
    if temperature is not None:
        page.fill("#temperature", str(temperature))
    if max_tokens is not None:
        page.fill("#max-tokens", str(max_tokens))
    if thinking is not None:
        page.select_option("#thinking", thinking)
    if tools is not None:
        page.fill("#tools", tools)
    if overflow is not None:
        page.select_option("#overflow", overflow)


def record_streamed_lengths(page) -> None:
    """From now on, remember every length the streaming answer's text reaches (window.streamedLengths)."""
    page.evaluate("""() => {
        window.streamedLengths = [];
        new MutationObserver(() => {
            const node = document.querySelector('.message.assistant.streaming .body');
            if (node) window.streamedLengths.push(node.textContent.length);
        }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
    }""")


@contextmanager
def slow_network(page, bytes_per_second: int = 2000):
    """Chromium's own network throttling, for as long as the block runs.

    The page paints a streaming answer once per animation frame, and the tiny model writes 40 tokens
    within two frames on a fast machine; on a slow link the same SSE bytes arrive over a second or
    more, so a test sees every step of the stream the page paints.
    """
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send("Network.emulateNetworkConditions",
             {"offline": False, "latency": 0, "downloadThroughput": bytes_per_second, "uploadThroughput": -1})
    try:
        yield
    finally:
        cdp.send("Network.emulateNetworkConditions",
                 {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})
        cdp.detach()


def record_open_reasoning(page) -> None:
    """From now on, note in window.sawOpenReasoning whether a streaming answer showed its reasoning open."""
    page.evaluate("""() => {
        window.sawOpenReasoning = false;
        new MutationObserver(() => {
            if (document.querySelector('.message.assistant.streaming details.reasoning[open]')) {
                window.sawOpenReasoning = true;
            }
        }).observe(document.getElementById('messages'), {subtree: true, childList: true, attributes: true});
    }""")


def send_message(page, text: str) -> None:
    """Send, and wait until the page has taken it (it counts its turns in body[data-turns])."""
    turns = int(page.get_attribute("body", "data-turns") or 0)
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    page.wait_for_function(f"() => Number(document.body.dataset.turns || 0) > {turns}")


def wait_for_answer(page) -> None:
    """Until the page is idle again: the answer is done and the conversation saved."""
    page.wait_for_selector("body:not([data-busy])", timeout=DONE_TIMEOUT_MS)
    page.wait_for_selector(".message.assistant.streaming", state="detached", timeout=DONE_TIMEOUT_MS)


def stop_answer(page) -> None:
    """Press Stop if the answer still streams, then wait until the page is idle.

    The answer may end between a check and the click, so Stop is pressed in the page in one step."""
    page.evaluate("() => { const stop = document.getElementById('stop'); if (!stop.hidden) stop.click(); }")
    wait_for_answer(page)


def conversation_id(page) -> int:
    return int(page.evaluate("() => new URLSearchParams(location.search).get('c')"))


def csrf_header(page) -> dict[str, str]:
    return {"X-CSRFToken": page.get_attribute('meta[name="csrf-token"]', "content"),
            "Content-Type": "application/json"}


def stored_conversation(page, server: LiveServer, conversation: int):
    """The conversation as the server keeps it (the page's own JSON API, with its session cookie)."""
    return page.request.get(f"{server.base_url}/ui/api/conversations/{conversation}")


def store_conversation(page, server: LiveServer, body: dict) -> int:
    response = page.request.post(f"{server.base_url}/ui/api/conversations", data=json.dumps(body),
                                 headers=csrf_header(page))
    assert response.status == 201, response.text()
    return response.json()["id"]


def playground_settings(page, temperature: float, max_tokens: int) -> None:
    page.fill("#temperature", str(temperature))
    page.fill("#max-tokens", str(max_tokens))


def doc_text(page) -> str:
    return page.evaluate("() => document.getElementById('doc').textContent")


def wait_for_continuation(page) -> None:
    page.wait_for_selector("#continue:not([hidden])", timeout=DONE_TIMEOUT_MS)
    page.wait_for_selector("#doc[contenteditable=plaintext-only]")


def popover_alternatives(page) -> list[tuple[str, str]]:
    """The shown alternatives as (token as the API says it, percent text)."""
    page.wait_for_selector("#popover:not([hidden])")
    return [(alt.get_attribute("data-token"), alt.query_selector(".p").inner_text())
            for alt in page.query_selector_all("#popover .alt")]


# Every element with its own visible text: its colour against the first opaque background behind it
# (WCAG 2 relative luminance). Disabled controls are exempt, as WCAG says.
LOW_CONTRAST = """(minimum) => {
    const channels = (colour) => (colour.match(/[\\d.]+/g) || []).map(Number);
    const luminance = ([r, g, b]) => {
        const lin = (c) => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
        return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b);
    };
    const background = (node) => {
        for (let n = node; n; n = n.parentElement) {
            const c = channels(getComputedStyle(n).backgroundColor);
            if (c.length === 3 || (c.length === 4 && c[3] > 0.9)) return c.slice(0, 3);
        }
        return channels(getComputedStyle(document.documentElement).backgroundColor).slice(0, 3);
    };
    const bad = [];
    for (const node of document.querySelectorAll('body *')) {
        const own = [...node.childNodes].some((c) => c.nodeType === 3 && c.textContent.trim());
        if (!own || !node.checkVisibility() || node.closest(':disabled, option, .tok, .swatch')) continue;
        const fg = channels(getComputedStyle(node).color).slice(0, 3);
        const [a, b] = [luminance(fg), luminance(background(node))];
        const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
        if (ratio < minimum) bad.push(`${node.tagName}.${node.className}: ${ratio.toFixed(2)} "${node.textContent.trim().slice(0, 30)}"`);
    }
    return bad;
}"""


def low_contrast(page, minimum: float = 4.5) -> list[str]:
    return page.evaluate(LOW_CONTRAST, minimum)


AXE_SOURCE = (Path(__file__).parent / "vendor" / "axe-4.14.1.min.js").read_text()


AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa", "best-practice"]


def axe_violations(page) -> list[str]:
    """axe-core's violations on the page as it is now, one line each (rule, impact, the elements).

    The rules run are WCAG 2.0, 2.1 and 2.2 at levels A and AA (2.2's target-size among them, which axe's
    defaults leave out) plus axe's best practices, which its defaults include.

    The vendored axe-core is evaluated by the browser's debugger protocol, which the page's CSP does not
    govern (the page itself could not load it: only its own scripts)."""
    if not page.evaluate("() => typeof axe !== 'undefined'"):
        page.evaluate(f"() => {{ {AXE_SOURCE}\n; window.axe = axe; }}")
    return page.evaluate("""async (tags) => {
        const result = await axe.run(document, {resultTypes: ['violations'], runOnly: {type: 'tag', values: tags}});
        return result.violations.map((v) => `${v.id} (${v.impact}): ${v.nodes.map((n) => n.target.join(' ')).join(', ')}`);
    }""", AXE_TAGS)
