"""Team accounts that add up, against a real server (embedded: SQLite, the database limiter).

The ledger here flushes only every 4 seconds, so whatever `/v1/key` shows right after a response
comes from the rows settled but not yet written (teams/pending_usage.py), and the checks that
wait for the database then prove each row is still counted once.
"""
from __future__ import annotations

import re
import sqlite3

import httpx
import openai
import pytest
from openai import OpenAI

from .conftest import TINY_MODEL
from .live_server import LiveServer, base_env
from .teams_setup import fresh_minute, ledger_rows, make_teams, manage, wait_for_rows

PROMPT = "Once upon a time"
FLUSH_SECONDS = 4.0


@pytest.fixture(scope="module")
def live(hf_cache, tmp_path_factory):
    work = tmp_path_factory.mktemp("team-accounts")
    env = base_env(hf_cache, work, INFERENCE_WORKER_ACK_TIMEOUT="120",
                   INFERENCE_LEDGER_FLUSH_SECONDS=str(FLUSH_SECONDS))
    server = LiveServer(env, work)
    server.env = env
    manage(env, "shell", "-c", "from django.contrib.auth import get_user_model; "
                               "get_user_model().objects.create_user('alice'); "
                               "get_user_model().objects.create_user('bob')")
    server.secrets = make_teams(env, teams={
        "prompt": [],
        "refusals": ["--rpm", "3", "--tpm", "200"],
        "heavy": ["--share", "3"],
        "light": [],
        "crew": [],
    }, keys={
        "prompt": ["--team", "prompt"],
        "refusals": ["--team", "refusals"],
        "heavy-batch": ["--team", "heavy", "--service-tier", "batch"],
        "light": ["--team", "light"],
    })
    warm = httpx.post(f"{server.base_url}/v1/completions", headers=server.headers, timeout=120,
                      json={"model": TINY_MODEL, "prompt": PROMPT, "max_tokens": 1})  # the model loads first
    assert warm.status_code == 200
    yield server
    server.stop()


def sdk(live: LiveServer, label: str) -> OpenAI:
    return OpenAI(base_url=f"{live.base_url}/v1", api_key=live.secrets[label], max_retries=0, timeout=120)


def key_status(live: LiveServer, secret: str) -> dict:
    response = httpx.get(f"{live.base_url}/v1/key", headers={"Authorization": f"Bearer {secret}"})
    assert response.status_code == 200, response.text
    return response.json()["data"]


def test_key_status_shows_a_response_as_soon_as_it_ends(live):
    client, secret = sdk(live, "prompt"), live.secrets["prompt"]
    assert (key_status(live, secret)["usage"], key_status(live, secret)["period_requests"]) == (0, 0)

    seen = client.completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=5).usage.total_tokens
    status = key_status(live, secret)  # no sleep: the ledger has not written the row yet
    assert (status["usage"], status["period_requests"], status["refused_requests"]) == (seen, 1, 0)

    stream = client.chat.completions.create(model=TINY_MODEL, messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=4, stream=True, stream_options={"include_usage": True})
    seen += [chunk.usage for chunk in stream if chunk.usage][0].total_tokens
    status = key_status(live, secret)
    assert (status["usage"], status["period_requests"]) == (seen, 2)
    assert len(ledger_rows(live, "prompt")) < 2, "the rows were written already: this proves nothing"

    # Once the batches are in the database, every row is counted once, not twice.
    rows = wait_for_rows(live, "prompt", 2)
    assert sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows) == seen
    status = key_status(live, secret)
    assert (status["usage"], status["period_requests"]) == (seen, 2)


def test_refused_requests_are_counted_apart(live):
    secret = live.secrets["refusals"]
    client = sdk(live, "refusals")
    fresh_minute(25)
    with pytest.raises(openai.RateLimitError) as too_big:  # prompt + 500 tokens > 200 a minute: refused at reserve
        client.completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=500)
    assert too_big.value.body["type"] == "tokens"
    seen = 0
    for _ in range(2):  # the refusal above took one of the 3 requests of this minute
        seen += client.completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=3).usage.total_tokens
    with pytest.raises(openai.RateLimitError) as over_rpm:
        client.completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=3)
    assert over_rpm.value.body["type"] == "requests"

    status = key_status(live, secret)
    assert (status["period_requests"], status["refused_requests"], status["usage"]) == (2, 2, seen)

    rows = wait_for_rows(live, "refusals", 4)
    refused = sorted((r["status_code"], r["error_code"], r["refused"]) for r in rows if r["refused"])
    assert refused == [(429, "rate_limit_exceeded", 1)] * 2
    assert all(r["status_code"] == 200 for r in rows if not r["refused"])
    status = key_status(live, secret)
    assert (status["period_requests"], status["refused_requests"], status["usage"]) == (2, 2, seen)


def member_names(live: LiveServer, team: str) -> list[str]:
    with sqlite3.connect(live.work_dir / "var" / "db.sqlite3") as db:
        return sorted(row[0] for row in db.execute(
            "select u.username from teams_membership m join teams_team t on t.id = m.team_id "
            "join auth_user u on u.id = m.user_id where t.name = ?", (team,)))


def test_team_member_command_adds_and_removes_idempotently(live):
    env = live.env
    script = """
import io
from django.core.management import call_command
from django.core.management.base import CommandError
def run(*args):
    out = io.StringIO()
    try:
        call_command("team_member", *args, stdout=out)
        print("OK", out.getvalue().strip())
    except CommandError as exc:
        print("ERROR", exc)
run("add", "crew", "alice")
run("add", "crew", "alice")
run("add", "crew", "bob", "--role", "owner")
run("add", "nosuchteam", "alice")
run("add", "crew", "nobody")
call_command("create_api_key", "alice-key", "--team", "crew", "--user", "alice", stdout=io.StringIO(),
             stderr=io.StringIO())
run("remove", "crew", "alice")
run("remove", "crew", "bob")
run("remove", "crew", "bob")
"""
    lines = [line for line in manage(env, "shell", "-c", script).stdout.splitlines()
             if line.startswith(("OK ", "ERROR "))]
    assert lines == [
        "OK alice added as member of team 'crew'.",
        "OK alice is already a member of team 'crew'; nothing changed.",
        "OK bob added as owner of team 'crew'.",
        "ERROR No team named 'nosuchteam' (create it with create_team).",
        "ERROR No user named 'nobody'.",
        lines[5],
        "OK Removed bob from team 'crew'.",
        "OK bob is not a member of team 'crew'; nothing changed.",
    ]
    assert lines[5].startswith("ERROR alice holds keys in team crew: alice-key (sk-inf-") and "--revoke-keys" in lines[5]
    assert member_names(live, "crew") == ["alice"]

    # The command line itself: exit codes and messages; removing with the keys revokes them.
    unknown = manage(env, "team_member", "remove", "crew", "nobody", check=False)
    assert unknown.returncode == 1 and "No user named 'nobody'." in unknown.stderr
    removed = manage(env, "team_member", "remove", "crew", "alice", "--revoke-keys")
    assert "Removed alice from team 'crew'." in removed.stdout
    assert member_names(live, "crew") == []
    with sqlite3.connect(live.work_dir / "var" / "db.sqlite3") as db:
        assert db.execute("select revoked_at is not null from teams_apikey where name = 'alice-key'").fetchone() == (1,)


def test_share_and_service_tier_in_key_status_and_the_admin_usage_page(live):
    heavy, light = live.secrets["heavy-batch"], live.secrets["light"]
    status = key_status(live, heavy)
    assert (status["team"], status["share"], status["service_tier"]) == ("heavy", 3.0, "batch")
    assert (key_status(live, light)["share"], key_status(live, light)["service_tier"]) == (1.0, "interactive")

    # A batch key's requests are served (the worker takes the job with its team and batch priority).
    heavy_tokens = sdk(live, "heavy-batch").completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=9,
                                                               extra_body={"ignore_eos": True}).usage.total_tokens
    light_tokens = sdk(live, "light").completions.create(model=TINY_MODEL, prompt=PROMPT, max_tokens=3,
                                                         extra_body={"ignore_eos": True}).usage.total_tokens
    wait_for_rows(live, "heavy", 1)
    wait_for_rows(live, "light", 1)

    from .helpers.admin import admin_client
    http = admin_client(live)
    page = http.get("/admin/teams/usagerecord/report/", params={"minutes": "60"}).text
    assert "the last 60 minutes" in page

    def cells(team: str) -> dict[str, str]:
        row = re.search(rf'<tr data-team="{team}">(.*?)</tr>', page).group(1)
        return dict(re.findall(r'<td class="([\w-]+)">([^<]*)</td>', row))

    listed = [cells(t) for t in re.findall(r'<tr data-team="([^"]+)">', page)]
    everyone, weights = sum(int(c["tokens"]) for c in listed), sum(float(c["weight"]) for c in listed)
    assert cells("heavy") == {"served": "1", "refused": "0", "tokens": str(heavy_tokens),
                              "token-share": f"{round(100 * heavy_tokens / everyone)} %", "weight": "3.0",
                              "weight-share": f"{round(100 * 3 / weights)} %"}
    assert cells("light")["tokens"] == str(light_tokens) and cells("light")["weight"] == "1.0"
    assert cells("light")["weight-share"] == f"{round(100 / weights)} %"

    # The team's share and the key's tier are editable in the admin.
    keys = http.get("/admin/teams/apikey/?q=heavy-batch").text
    key_id = re.search(r"/admin/teams/apikey/(\d+)/change/", keys).group(1)
    assert 'name="service_tier"' in http.get(f"/admin/teams/apikey/{key_id}/change/").text
    with sqlite3.connect(live.work_dir / "var" / "db.sqlite3") as db:
        team_id = db.execute("select id from teams_team where name = 'light'").fetchone()[0]
    form = http.get(f"/admin/teams/team/{team_id}/change/").text
    assert 'name="share"' in form
    refused = http.post(f"/admin/teams/team/{team_id}/change/", data={
        "name": "light", "allowed_models": "[]", "budget_period_days": "30", "share": "0",
        "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0",
        "csrfmiddlewaretoken": http.cookies["csrftoken"]})
    assert "A share is a weight above 0" in refused.text


def test_create_team_refuses_a_share_of_zero(live):
    result = manage(live.env, "create_team", "zero", "--share", "0", check=False)
    assert result.returncode == 1 and "A share is a weight above 0" in result.stderr


def test_admin_adds_a_member_and_keeps_one_holding_keys_from_removal(live):
    from .helpers.admin import admin_client
    http = admin_client(live)
    with sqlite3.connect(live.work_dir / "var" / "db.sqlite3") as db:
        team_id = db.execute("select id from teams_team where name = 'light'").fetchone()[0]
        bob = db.execute("select id from auth_user where username = 'bob'").fetchone()[0]
    url = f"/admin/teams/team/{team_id}/change/"
    team = {"name": "light", "allowed_models": "[]", "budget_period_days": "30", "share": "1.0",
            "memberships-INITIAL_FORMS": "0", "memberships-TOTAL_FORMS": "1",
            "memberships-0-team": str(team_id), "memberships-0-user": str(bob), "memberships-0-role": "member"}
    added = http.post(url, data={**team, "csrfmiddlewaretoken": http.cookies["csrftoken"]})
    assert added.status_code == 200 and "errornote" not in added.text
    assert member_names(live, "light") == ["bob"]

    manage(live.env, "create_api_key", "bob-key", "--team", "light", "--user", "bob")
    with sqlite3.connect(live.work_dir / "var" / "db.sqlite3") as db:
        membership = db.execute("select id from teams_membership where team_id = ?", (team_id,)).fetchone()[0]
    removing = {**team, "memberships-INITIAL_FORMS": "1", "memberships-0-id": str(membership),
                "memberships-0-DELETE": "on", "csrfmiddlewaretoken": http.cookies["csrftoken"]}
    kept = http.post(url, data=removing)
    assert "bob holds keys in this team: bob-key (sk-inf-" in kept.text
    assert member_names(live, "light") == ["bob"]

    assert manage(live.env, "team_member", "remove", "light", "bob", "--revoke-keys").returncode == 0
    assert member_names(live, "light") == []
