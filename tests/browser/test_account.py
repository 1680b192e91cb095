"""/account and teams in the browser: limits, usage, own keys; each team sees only its models."""
from __future__ import annotations

import io
import json
import re
import time

import httpx
from openai import OpenAI

from ..conftest import TINY_MODEL
from .conftest import SECOND_MODEL, screenshot
from .pages import chat_settings, csrf_header, send_message, wait_for_answer


def open_account(page, server):
    page.goto(f"{server.base_url}/account")
    page.wait_for_selector("body[data-ready=true]")


def test_account_shows_the_team_limits_usage_and_own_keys(page_of, web_server):
    page = page_of("uma")  # the only member of team "metered": no other test adds to its usage
    chat_settings(page, temperature=0, max_tokens=5)
    send_message(page, "Count me")
    wait_for_answer(page)

    # The session's request was counted against alice's team, like a key's (the ledger is written in batches).
    deadline = time.monotonic() + 20
    while True:
        open_account(page, web_server)
        if "0 requests" not in page.inner_text("#usage-summary"):
            break
        assert time.monotonic() < deadline, page.inner_text("#usage-summary")
        time.sleep(0.5)
    team = page.inner_text("#team")
    assert "metered" in team and TINY_MODEL in team
    assert "5 completion tokens" in page.inner_text("#usage-summary")
    assert page.locator("#usage-bars .bar").count() == 30
    assert page.locator("#limits tr").count() == 2  # the header and the team's row

    # A new key: the secret is shown once and works; the model list is the team's.
    page.fill("#key-name", "laptop")
    page.click("#new-key button[type=submit]")
    page.wait_for_selector("#secret-box:not([hidden])")
    secret = page.inner_text("#secret")
    assert secret.startswith("sk-inf-")
    screenshot(page, "account")
    models = httpx.get(f"{web_server.base_url}/v1/models", headers={"Authorization": f"Bearer {secret}"})
    assert [m["id"] for m in models.json()["data"]] == [TINY_MODEL]
    open_account(page, web_server)
    assert secret not in page.content()
    key_row = page.locator("#keys tr", has_text="laptop")
    assert "active" in key_row.inner_text()

    # Revoked from the page: the key fails from its next request.
    key_row.locator("button:text('Revoke')").click()
    page.wait_for_selector("#keys tr:has-text('laptop'):has-text('revoked')")
    refused = httpx.get(f"{web_server.base_url}/v1/models", headers={"Authorization": f"Bearer {secret}"})
    assert refused.status_code == 401


def test_each_team_sees_only_its_models_and_its_own_keys(page_of, web_server):
    alice = page_of("alice")
    assert alice.eval_on_selector_all("[data-model-select] option", "os => os.map(o => o.value)") == [TINY_MODEL]
    bob = page_of("bob")
    assert bob.eval_on_selector_all("[data-model-select] option", "os => os.map(o => o.value)") == [SECOND_MODEL]

    # Bob's session may not use team red's model: it does not exist for him.
    refused = bob.request.post(f"{web_server.base_url}/v1/chat/completions", headers=csrf_header(bob),
                               data={"model": TINY_MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert refused.status == 404
    assert refused.json()["error"]["code"] == "model_not_found"
    chat_settings(bob, temperature=0, max_tokens=3)
    send_message(bob, "Hello from blue")
    wait_for_answer(bob)
    assert bob.is_hidden("#error")
    assert SECOND_MODEL in bob.inner_text(".message.assistant .stats")

    # Alice's key is not bob's to see or revoke.
    created = alice.request.post(f"{web_server.base_url}/ui/api/keys", headers=csrf_header(alice),
                                 data={"name": "alice's"})
    key_id = created.json()["id"]
    open_account(bob, web_server)
    assert "alice's" not in bob.inner_text("#keys")
    assert bob.request.delete(f"{web_server.base_url}/ui/api/keys/{key_id}", headers=csrf_header(bob)).status == 404
    assert "blue" in bob.inner_text("#team")


def batch_file(client: OpenAI, count: int, max_tokens: int) -> str:
    lines = [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": TINY_MODEL, "prompt": f"Count {i}", "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True}} for i in range(count)]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    return client.files.create(file=("input.jsonl", io.BytesIO(content)), purpose="batch").id


def test_account_shows_the_team_batches_with_their_counts_and_cancels_one(page_of, web_server):
    alice = page_of("alice")
    base = web_server.base_url
    created = alice.request.post(f"{base}/ui/api/keys", headers=csrf_header(alice), data={"name": "batches"})
    client = OpenAI(base_url=f"{base}/v1", api_key=created.json()["secret"], max_retries=0, timeout=120)

    # A small batch made with the team's key through the SDK: the page follows it to the end.
    small = client.batches.create(input_file_id=batch_file(client, 3, 4), endpoint="/v1/completions",
                                  completion_window="24h")
    open_account(alice, web_server)
    small_row = alice.locator(f"#batches tr[data-batch-id='{small.id}']")
    assert "/v1/completions" in small_row.inner_text()
    alice.wait_for_selector(f"#batches tr[data-batch-id='{small.id}'][data-status=completed]", timeout=180_000)
    assert "3 / 0 / 3" in small_row.inner_text()
    assert small_row.locator("button").count() == 0  # a finished batch cannot be cancelled
    link = small_row.locator("a", has_text="output")
    output = alice.request.get(base + link.get_attribute("href"))  # the page's session downloads it
    assert output.status == 200
    assert sorted(json.loads(text)["custom_id"] for text in output.text().splitlines()) == [
        "line-0", "line-1", "line-2"]

    # A long one, newest first; cancelled from the page, it stops with what was done.
    long = client.batches.create(input_file_id=batch_file(client, 200, 100), endpoint="/v1/completions",
                                 completion_window="24h")
    open_account(alice, web_server)
    ids = alice.eval_on_selector_all("#batches tr[data-batch-id]", "rows => rows.map(r => r.dataset.batchId)")
    assert ids[:2] == [long.id, small.id]
    alice.locator(f"#batches tr[data-batch-id='{long.id}'] button:text('Cancel')").click()
    alice.wait_for_selector(f"#batches tr[data-batch-id='{long.id}'][data-status=cancelled]", timeout=120_000)
    screenshot(alice, "account-batches")
    alice.set_viewport_size({"width": 375, "height": 800})
    screenshot(alice, "account-batches-phone")
    cancelled = client.batches.retrieve(long.id)
    assert cancelled.status == "cancelled" and cancelled.request_counts.completed < 200
    counts = cancelled.request_counts
    long_text = alice.inner_text(f"#batches tr[data-batch-id='{long.id}']")
    assert f"{counts.completed} / {counts.failed} / {counts.total}" in long_text
    assert alice.js_errors == []

    # Another team's member sees none of them, and may neither cancel them nor read their files.
    bob = page_of("bob")
    open_account(bob, web_server)
    assert bob.locator("#batches tr[data-batch-id]").count() == 0 and bob.is_visible("#batches-empty")
    refused = bob.request.post(f"{base}/v1/batches/{small.id}/cancel", headers=csrf_header(bob))
    assert refused.status == 404 and refused.json()["error"]["code"] == "batch_not_found"
    assert bob.request.get(base + link.get_attribute("href")).status == 404


def test_a_rate_limit_says_when_to_try_again(page_of, web_server):
    page = page_of("carol")  # team "slow": 2 requests a minute
    chat_settings(page, temperature=0, max_tokens=2)
    for text in ("one", "two", "three", "four", "five"):  # a minute that ends between two sends resets the count
        send_message(page, text)
        wait_for_answer(page)
        if page.is_visible("#error"):
            break
    message = page.inner_text("#error")
    assert message.startswith("Rate limit reached") and re.search(r"try again in \d+", message, re.I), message
    screenshot(page, "chat-rate-limited")
