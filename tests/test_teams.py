"""Teams against a real server (embedded: SQLite counters): isolation, allow-lists, limits, ledger, /v1/key."""
from __future__ import annotations

import asyncio
import json
import re
import shutil
import sqlite3
import time

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from workers.tiny.builders import build_tiny_model

from .conftest import TINY_MODEL
from .live_server import LiveServer, base_env
from .helpers.admin import admin_client
from .teams_setup import budget_burst, fresh_minute, ledger_rows, make_teams, manage, wait_for_rows

OTHER = "local/other"
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def teams_cache(hf_cache, tmp_path_factory):
    cache = tmp_path_factory.mktemp("teams-cache") / "hub"
    shutil.copytree(hf_cache, cache)
    build_tiny_model(OTHER, cache_dir=cache, seed=1)
    return cache


@pytest.fixture(scope="module")
def live(teams_cache, tmp_path_factory):
    work = tmp_path_factory.mktemp("teams-server")
    # Forwards 10 ms slower: a stream whose client leaves after its first token is still generating when the
    # server hears it leave (the TPM test's cancelled stream could otherwise finish all its tokens first).
    env = base_env(teams_cache, work, INFERENCE_WORKER_ACK_TIMEOUT="120", INFERENCE_LEDGER_FLUSH_SECONDS="0.2",
                   INFERENCE_FAILPOINTS="engine.forward=delay(10)")
    server = LiveServer(env, work)
    server.env = env
    server.secrets = make_teams(env, teams={
        "alpha": ["--models", TINY_MODEL],
        "beta": [],
        "rpm2": ["--rpm", "2"],
        "iso": ["--rpm", "1"],
        "tpm": ["--tpm", "60"],
        "solo": ["--max-parallel", "1"],
        "budget": ["--token-budget", "100", "--budget-period", "7"],
        "ledger": [],
        "meter": ["--rpm", "3", "--tpm", "1000"],
    }, keys={
        "alpha": ["--team", "alpha"],
        "beta": ["--team", "beta"],
        "beta-narrow": ["--team", "beta", "--models", OTHER, "--rpm", "50"],
        "rpm2": ["--team", "rpm2"],
        "iso": ["--team", "iso"],
        "tpm": ["--team", "tpm"],
        "solo": ["--team", "solo"],
        "budget": ["--team", "budget"],
        "ledger": ["--team", "ledger"],
        "meter": ["--team", "meter", "--tpm", "500", "--manage-models"],  # the key's tpm is the tighter; the team's rpm
        "revoke-me": ["--team", "beta"],
        "used": ["--team", "beta"],
        "expiring": ["--team", "beta", "--expires-days", "0.00003"],  # about 2.6 seconds
    })
    warm = httpx.post(f"{server.base_url}/v1/completions", headers=server.headers, timeout=120,
                      json={"model": TINY_MODEL, "prompt": PROMPT, "max_tokens": 1})  # load the model before timing
    assert warm.status_code == 200
    yield server
    server.stop()


def sdk(live: LiveServer, label: str) -> OpenAI:
    return OpenAI(base_url=f"{live.base_url}/v1", api_key=live.secrets[label], max_retries=0, timeout=120)


def post(live: LiveServer, label: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{live.base_url}{path}", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {live.secrets[label]}"})


def complete(live: LiveServer, label: str, max_tokens: int = 4, **extra) -> httpx.Response:
    return post(live, label, "/v1/completions",
                {"model": TINY_MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, **extra})


def key_status(live: LiveServer, label: str) -> dict:
    response = httpx.get(f"{live.base_url}/v1/key", headers={"Authorization": f"Bearer {live.secrets[label]}"})
    assert response.status_code == 200, response.text
    return response.json()["data"]


ENDPOINTS = {
    "/v1/completions": {"prompt": PROMPT, "max_tokens": 2},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/v1/responses": {"input": "hi", "max_output_tokens": 2},
    "/tokenize": {"prompt": PROMPT},
    "/detokenize": {"tokens": [1, 2, 3]},
    "/load_model": {},
    "/unload_model": {},
}


def test_allow_lists_hide_other_models_on_every_endpoint(live):
    # The team allows only the tiny model; a model outside it looks exactly like one that does not exist.
    alpha = sdk(live, "alpha")
    assert [m.id for m in alpha.models.list().data] == [TINY_MODEL]
    for missing in (OTHER, "nobody/nothing"):
        with pytest.raises(openai.NotFoundError) as caught:
            alpha.models.retrieve(missing)
        assert caught.value.body["code"] == "model_not_found"
    for path, body in ENDPOINTS.items():
        refused = post(live, "alpha", path, {"model": OTHER, **body})
        unknown = post(live, "alpha", path, {"model": "nobody/nothing", **body})
        assert refused.status_code == 404, (path, refused.text)
        assert refused.json()["error"]["code"] == "model_not_found"
        assert refused.json()["error"]["message"] == unknown.json()["error"]["message"].replace("nobody/nothing", OTHER)
    assert post(live, "alpha", "/tokenize", {"model": TINY_MODEL, "prompt": PROMPT}).status_code == 200

    # A key narrows its team (beta allows all; this key only OTHER); the team's other keys see both.
    narrow = sdk(live, "beta-narrow")
    assert [m.id for m in narrow.models.list().data] == [OTHER]
    with pytest.raises(openai.NotFoundError):
        narrow.completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=2)
    assert narrow.completions.create(model=OTHER, prompt=PROMPT, max_tokens=2).usage.completion_tokens == 2
    assert sorted(m.id for m in sdk(live, "beta").models.list().data) == [OTHER, TINY_MODEL]


def test_teams_are_isolated(live):
    # iso's limit is spent; beta is not touched by it, and each key reports its own team.
    fresh_minute()
    assert complete(live, "iso").status_code == 200
    assert complete(live, "iso").status_code == 429
    assert complete(live, "beta").status_code == 200
    assert key_status(live, "beta")["team"] == "beta"
    assert key_status(live, "iso")["team"] == "iso"
    assert key_status(live, "alpha")["models"] == [TINY_MODEL]
    iso_rows = wait_for_rows(live, "iso", 2)
    assert sorted(row["status_code"] for row in iso_rows) == [200, 429]
    assert not {row["request_id"] for row in iso_rows} & {row["request_id"] for row in ledger_rows(live, "beta")}


def test_requests_per_minute_with_headers_and_retry_after(live):
    fresh_minute()
    first, second, third = (complete(live, "rpm2") for _ in range(3))
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert second.headers["x-ratelimit-remaining-requests"] == "0"
    assert first.headers["x-ratelimit-reset-requests"].endswith("s")
    assert third.status_code == 429
    error = third.json()["error"]
    assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")
    assert 1 <= int(third.headers["Retry-After"]) <= 60
    assert third.headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(openai.RateLimitError):
        sdk(live, "rpm2").completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=2)


RATE_HEADERS = [f"x-ratelimit-{what}-{kind}" for kind in ("requests", "tokens")
                for what in ("limit", "remaining", "reset")]
NO_LIMIT = str(2**31 - 1)


def rate(response) -> dict[str, str]:
    """The six x-ratelimit-* headers (KeyError when one is missing)."""
    return {name.removeprefix("x-ratelimit-"): response.headers[name] for name in RATE_HEADERS}


def reset_seconds(text: str) -> int:
    """OpenAI's reset durations: 0s, 7s, 1m0s, 2h3m4s."""
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(\d+)s", text)
    assert match, text
    hours, minutes, secs = (int(part or 0) for part in match.groups())
    return hours * 3600 + minutes * 60 + secs


def test_every_response_carries_the_rate_limit_headers_and_only_inference_counts(live):
    prompt_tokens = post(live, "beta", "/tokenize", {"model": TINY_MODEL, "prompt": PROMPT}).json()["count"]
    fresh_minute(25)
    client = sdk(live, "meter")
    auth = {"Authorization": f"Bearer {live.secrets['meter']}"}

    def get(path: str) -> httpx.Response:
        return httpx.get(f"{live.base_url}{path}", headers=auth, timeout=60)

    # Listing models, the key's status, a 404 and a 400 read the counters and count nothing.
    for _ in range(4):
        listed = rate(client.with_raw_response.models.list())
        assert {k: v for k, v in listed.items() if not k.startswith("reset")} == {
            "limit-requests": "3", "remaining-requests": "3", "limit-tokens": "500", "remaining-tokens": "500"}
        assert 1 <= reset_seconds(listed["reset-requests"]) <= 60 and 1 <= reset_seconds(listed["reset-tokens"]) <= 60
    for response in (get(f"/v1/models/{TINY_MODEL}"), get("/v1/key"), get("/v1/models/nobody/nothing"),
                     post(live, "meter", "/v1/completions", {"prompt": PROMPT})):
        assert response.status_code in (200, 400, 404), response.text
        assert rate(response)["remaining-requests"] == "3", response.request.url
    # A body over the limit is refused at the edge before it is read, the key not looked up: like a 401, no headers.
    huge = b'{"model": "%s", "prompt": "%s"}' % (TINY_MODEL.encode(), b"a" * (3 * 1024 * 1024))
    too_large = httpx.post(f"{live.base_url}/v1/completions", content=huge, timeout=60,
                           headers={**auth, "Content-Type": "application/json"})
    assert too_large.status_code == 413 and "x-ratelimit-limit-requests" not in too_large.headers

    # A streamed completion (the SDK's raw response): the headers come before the first token.
    raw = client.completions.with_raw_response.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=4, stream=True,
                                                      extra_body={"ignore_eos": True})
    assert int(raw.headers["x-ratelimit-remaining-requests"]) == 2
    assert int(raw.headers["x-ratelimit-remaining-tokens"]) == 500 - prompt_tokens - 4
    assert sum(len(chunk.choices[0].text) > 0 for chunk in raw.parse() if chunk.choices) > 0
    status = rate(get("/v1/key"))
    assert (status["remaining-requests"], int(status["remaining-tokens"])) == ("2", 500 - prompt_tokens - 4)

    # /tokenize is a job on a worker and counts; /load_model (an SSE stream) does not.
    tokenized = post(live, "meter", "/tokenize", {"model": TINY_MODEL, "prompt": PROMPT})
    assert tokenized.status_code == 200
    assert rate(tokenized)["remaining-requests"] == "1"
    assert int(rate(tokenized)["remaining-tokens"]) == 500 - 2 * prompt_tokens - 4
    with httpx.stream("POST", f"{live.base_url}/load_model", headers=auth, json={"model": TINY_MODEL},
                      timeout=120) as loading:
        assert loading.status_code == 200
        assert rate(loading)["remaining-requests"] == "1"
        loading.read()

    assert rate(complete(live, "meter"))["remaining-requests"] == "0"
    refused = complete(live, "meter")
    assert refused.status_code == 429 and refused.json()["error"]["type"] == "requests"
    assert (rate(refused)["limit-requests"], rate(refused)["remaining-requests"]) == ("3", "0")
    assert 1 <= reset_seconds(rate(refused)["reset-requests"]) <= 60
    with pytest.raises(openai.RateLimitError) as caught:
        client.completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=2)
    assert caught.value.response.headers["x-ratelimit-remaining-requests"] == "0"
    after = client.with_raw_response.models.list()  # never refused: listing is not a request against rpm
    assert after.http_response.status_code == 200 and rate(after)["remaining-requests"] == "0"


def test_unlimited_keys_get_the_six_headers_as_no_limit(live):
    unlimited = {"limit-requests": NO_LIMIT, "remaining-requests": NO_LIMIT, "reset-requests": "0s",
                 "limit-tokens": NO_LIMIT, "remaining-tokens": NO_LIMIT, "reset-tokens": "0s"}
    beta = sdk(live, "beta")
    assert rate(beta.with_raw_response.models.list()) == unlimited
    assert rate(complete(live, "beta")) == unlimited
    streamed = beta.chat.completions.with_raw_response.create(
        model=TINY_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=True)
    assert rate(streamed) == unlimited
    list(streamed.parse())
    # A key with only an rpm, on a team with none: the requests trio is the key's, the tokens trio "no limit".
    narrow = rate(sdk(live, "beta-narrow").completions.with_raw_response.create(model=OTHER, prompt=PROMPT,
                                                                                max_tokens=2))
    assert narrow["limit-requests"] == "50" and int(narrow["remaining-requests"]) < 50
    assert (narrow["limit-tokens"], narrow["remaining-tokens"], narrow["reset-tokens"]) == (NO_LIMIT, NO_LIMIT, "0s")
    assert not any(name.startswith("x-ratelimit") for name in httpx.get(f"{live.base_url}/v1/models").headers)


def test_tokens_per_minute_are_reserved_at_admission_and_settled_to_real_use(live):
    fresh_minute(10)
    prompt_tokens = post(live, "beta", "/tokenize", {"model": TINY_MODEL, "prompt": PROMPT}).json()["count"]
    # Prompt + max_tokens is reserved before the first token: a request that could pass the limit never starts.
    too_big = complete(live, "tpm", max_tokens=61 - prompt_tokens)
    assert too_big.status_code == 429
    assert (too_big.json()["error"]["type"], too_big.json()["error"]["code"]) == ("tokens", "rate_limit_exceeded")
    assert 1 <= int(too_big.headers["Retry-After"]) <= 60

    # A stream reserves prompt + 30; its client leaves after a few tokens and the rest comes back.
    with httpx.stream("POST", f"{live.base_url}/v1/completions", timeout=60,
                      headers={"Authorization": f"Bearer {live.secrets['tpm']}"},
                      json={"model": TINY_MODEL, "prompt": PROMPT, "max_tokens": 30, "stream": True,
                            "ignore_eos": True}) as response:
        assert int(response.headers["x-ratelimit-remaining-tokens"]) == 60 - prompt_tokens - 30
        next(line for line in response.iter_lines() if line.startswith("data: {"))
    deadline = time.monotonic() + 30  # the server hears the client left, then the engine drops the row
    while key_status(live, "tpm")["rate_limit"][0]["remaining_tokens"] <= 60 - prompt_tokens - 30:
        assert time.monotonic() < deadline, "the cancelled stream's tokens did not come back"
        time.sleep(0.2)
    used_by_stream = 60 - key_status(live, "tpm")["rate_limit"][0]["remaining_tokens"]
    assert prompt_tokens < used_by_stream < prompt_tokens + 30

    # What fits in the rest of the minute (how many tokens the stream made before the server saw its client
    # leave depends on the machine's load).
    fits = min(30, 60 - used_by_stream - prompt_tokens)
    assert fits >= 1, (used_by_stream, prompt_tokens)
    ok = complete(live, "tpm", max_tokens=fits)
    assert ok.status_code == 200
    assert ok.headers["x-ratelimit-limit-tokens"] == "60"
    assert int(ok.headers["x-ratelimit-remaining-tokens"]) == 60 - used_by_stream - prompt_tokens - fits
    refused = complete(live, "tpm", max_tokens=30)
    assert refused.status_code == 429
    assert refused.json()["error"]["type"] == "tokens"


def test_max_parallel_requests(live):
    async def scenario():
        client = AsyncOpenAI(base_url=f"{live.base_url}/v1", api_key=live.secrets["solo"], max_retries=0, timeout=120)
        # Long enough to be generating still when the second request lands on a loaded machine.
        stream = await client.completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=480, stream=True,
                                                 extra_body={"ignore_eos": True})
        first = await stream.__anext__()
        assert first.choices
        async with httpx.AsyncClient(timeout=60) as http:
            second = await http.post(f"{live.base_url}/v1/completions",
                                     headers={"Authorization": f"Bearer {live.secrets['solo']}"},
                                     json={"model": TINY_MODEL, "prompt": PROMPT, "max_tokens": 2})
        async for _ in stream:
            pass
        return second

    second = asyncio.run(scenario())
    assert second.status_code == 429
    assert second.json()["error"]["type"] == "requests"
    assert second.headers["Retry-After"] == "1"
    assert complete(live, "solo").status_code == 200  # the slot came back when the stream ended


def test_budget_is_never_exceeded_by_32_concurrent_requests(live):
    served = budget_burst([live.base_url], live.secrets["budget"])
    assert served and len(served) < 32
    assert sum(served) <= 100
    assert sum(served) + served[0] > 100  # refused only when the next one would not have fitted
    status = key_status(live, "budget")
    assert (status["limit"], status["usage"], status["limit_remaining"]) == (100, sum(served), 100 - sum(served))
    rows = wait_for_rows(live, "budget", 32)
    assert sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows) == sum(served)
    assert sorted(r["status_code"] for r in rows).count(429) == 32 - len(served)


def test_revoked_and_expired_keys_fail_on_the_next_request(live):
    assert complete(live, "revoke-me").status_code == 200
    manage(live.env, "shell", "-c",
           "from teams.models import APIKey; from teams.services import revoke_keys; "
           "revoke_keys(APIKey.objects.filter(name='revoke-me'))")
    refused = complete(live, "revoke-me")
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"
    deadline = time.monotonic() + 10
    while complete(live, "expiring").status_code == 200:
        assert time.monotonic() < deadline, "the key did not expire"
        time.sleep(0.5)
    assert complete(live, "expiring").status_code == 401



def test_a_keys_use_is_recorded_once_a_minute(live):
    """Its first use writes last_used_at; the next ones within the minute (their lookup on the long-lived
    thread, `initial` on the event loop) leave it alone, and are served."""
    def last_used() -> str | None:
        with sqlite3.connect(live.work_dir / "var" / "db.sqlite3") as db:
            return db.execute("select last_used_at from teams_apikey where name = 'used'").fetchone()[0]

    assert last_used() is None
    assert complete(live, "used").status_code == 200
    first = last_used()
    assert first is not None
    assert [complete(live, "used").status_code for _ in range(3)] == [200] * 3
    assert last_used() == first

def test_ledger_totals_equal_the_usage_clients_saw(live):
    client = sdk(live, "ledger")
    seen = 0
    for max_tokens in (3, 5):
        seen += client.completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=max_tokens).usage.total_tokens
        seen += client.chat.completions.create(model=TINY_MODEL, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=max_tokens).usage.total_tokens
        for stream in (
            client.completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=max_tokens, stream=True,
                                      stream_options={"include_usage": True}),
            client.chat.completions.create(model=TINY_MODEL, messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=max_tokens, stream=True, stream_options={"include_usage": True}),
        ):
            seen += [chunk.usage for chunk in stream if chunk.usage][0].total_tokens

    # A client that goes away mid-stream: what was generated for it up to then is counted.
    with httpx.stream("POST", f"{live.base_url}/v1/completions", timeout=60,
                      headers={"Authorization": f"Bearer {live.secrets['ledger']}"},
                      json={"model": TINY_MODEL, "prompt": PROMPT, "max_tokens": 400, "stream": True,
                            "ignore_eos": True, "return_token_ids": True}) as response:
        received = 0
        for line in response.iter_lines():
            if line.startswith("data: {"):
                received += sum(len(choice["token_ids"]) for choice in json.loads(line[6:])["choices"])
                if received >= 5:
                    break

    rows = wait_for_rows(live, "ledger", 9)
    finished = [r for r in rows if not r["cancelled"]]
    assert len(finished) == 8
    assert sum(r["prompt_tokens"] + r["completion_tokens"] for r in finished) == seen
    assert all(r["status_code"] == 200 and r["time_to_first_token_ms"] is not None for r in finished)
    assert {r["endpoint"] for r in finished} == {"/v1/completions", "/v1/chat/completions"}
    cancelled = [r for r in rows if r["cancelled"]]
    assert len(cancelled) == 1
    assert received <= cancelled[0]["completion_tokens"] < 400
    assert cancelled[0]["prompt_tokens"] > 0


def test_key_status_in_openrouter_shape(live):
    status = key_status(live, "beta-narrow")
    assert status["label"].startswith("sk-inf-") and status["label"].endswith("…")
    assert status["team"] == "beta" and status["models"] == [OTHER]
    assert status["limit"] is None and status["limit_remaining"] is None
    assert status["usage"] >= 0
    key_scope = [s for s in status["rate_limit"] if s["scope"] == "key"][0]
    assert key_scope["requests_per_minute"] == 50
    assert httpx.get(f"{live.base_url}/v1/key").status_code == 401


def test_admin_shows_a_new_keys_secret_once_and_revokes_it(live):
    http = admin_client(live)
    with sqlite3.connect(live.work_dir / "var" / "db.sqlite3") as db:
        team_id = db.execute("select id from teams_team where name = 'tpm'").fetchone()[0]
    fields = {"name": "from-admin", "team": str(team_id), "user": "", "allowed_models": "[]", "rpm": "",
              "tpm": "100", "max_parallel": "", "expires_at_0": "", "expires_at_1": "",
              "csrfmiddlewaretoken": http.cookies["csrftoken"]}
    narrowing = http.post("/admin/teams/apikey/add/", data=fields)
    assert "At most the team" in narrowing.text  # the team allows 60 tokens a minute
    created = http.post("/admin/teams/apikey/add/", data={**fields, "tpm": "50"})
    secret = created.text.split('<code id="api-key-secret"', 1)[1].split(">", 1)[1].split("<", 1)[0]
    assert secret.startswith("sk-inf-")
    headers = {"Authorization": f"Bearer {secret}"}
    assert httpx.get(f"{live.base_url}/v1/models", headers=headers).status_code == 200
    assert httpx.get(f"{live.base_url}/v1/key", headers=headers).json()["data"]["name"] == "from-admin"

    changelist = http.get("/admin/teams/apikey/?q=from-admin").text
    assert secret not in changelist and secret[:12] in changelist
    key_id = re.search(r"/admin/teams/apikey/(\d+)/change/", changelist).group(1)
    assert secret not in http.get(f"/admin/teams/apikey/{key_id}/change/").text
    assert secret.encode() not in (live.work_dir / "var" / "db.sqlite3").read_bytes()
    done = http.post("/admin/teams/apikey/", data={"action": "revoke", "_selected_action": key_id,
                                                    "csrfmiddlewaretoken": http.cookies["csrftoken"]})
    assert "Revoked 1 key" in done.text
    assert httpx.get(f"{live.base_url}/v1/models", headers=headers).status_code == 401


def test_admin_usage_report_draws_a_chart_and_exports_csv(live):
    assert complete(live, "ledger").status_code == 200
    wait_for_rows(live, "ledger", 1)
    http = admin_client(live)
    page = http.get("/admin/teams/usagerecord/report/", params={"group": "model", "team": "ledger"})
    assert page.status_code == 200
    assert '<svg id="usage-chart"' in page.text and "<rect" in page.text and TINY_MODEL in page.text
    exported = http.get("/admin/teams/usagerecord/report/", params={"team": "ledger", "format": "csv"})
    lines = exported.text.strip().splitlines()
    assert lines[0] == "day,team,key,model,requests,refused,prompt_tokens,completion_tokens,total_tokens"
    total = sum(int(line.split(",")[-1]) for line in lines[1:])
    assert total == sum(r["prompt_tokens"] + r["completion_tokens"] for r in ledger_rows(live, "ledger"))
