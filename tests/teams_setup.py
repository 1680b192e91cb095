"""Helpers for the teams tests: teams and keys made by the real management commands, minute alignment."""
from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import time

import openai
from openai import AsyncOpenAI

from .conftest import TINY_MODEL
from .live_server import run_manage

# One `manage.py shell` run makes every team and key a test needs (each Django start costs seconds).
MAKE_SCRIPT = """
import io, json
from contextlib import redirect_stdout
from django.core.management import call_command
spec = json.loads({spec!r})
secrets = {{}}
for name, args in spec.get("teams", {{}}).items():
    call_command("create_team", name, *args, stdout=io.StringIO())
for label, args in spec.get("keys", {{}}).items():
    out = io.StringIO()
    call_command("create_api_key", label, *args, stdout=out, stderr=io.StringIO())
    secrets[label] = out.getvalue().strip().splitlines()[-1]
print("SECRETS=" + json.dumps(secrets))
"""


def manage(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = run_manage(list(args), env)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def make_teams(env: dict[str, str], teams: dict[str, list[str]], keys: dict[str, list[str]]) -> dict[str, str]:
    """Run create_team / create_api_key for each entry; returns {key label: secret}."""
    script = MAKE_SCRIPT.format(spec=json.dumps({"teams": teams, "keys": keys}))
    out = manage(env, "shell", "-c", script).stdout
    return json.loads(out.split("SECRETS=", 1)[1].strip())


def fresh_minute(needed: float = 20.0) -> None:
    """Wait for a new minute window if fewer than `needed` seconds are left in this one (on average a wait of
    needed² / 120 s: ask for what the test takes, with room for a loaded machine, not more)."""
    left = 60 - time.time() % 60
    if left < needed:
        time.sleep(left + 0.2)


def budget_burst(base_urls: list[str], api_key: str, count: int = 32, max_tokens: int = 8) -> list[int]:
    """`count` concurrent completions spread over the servers; the total tokens of each one served.

    Every refusal must be the budget's (429 insufficient_quota, type tokens)."""
    async def one(client: AsyncOpenAI) -> int | None:
        try:
            result = await client.completions.create(model=TINY_MODEL, prompt="Once upon a time",
                                                     max_tokens=max_tokens, extra_body={"ignore_eos": True})
            return result.usage.total_tokens
        except openai.RateLimitError as exc:
            assert (exc.body["code"], exc.body["type"]) == ("insufficient_quota", "tokens")
            return None

    async def burst() -> list[int | None]:
        clients = [AsyncOpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=120) for url in base_urls]
        return await asyncio.gather(*(one(clients[i % len(clients)]) for i in range(count)))

    return [tokens for tokens in asyncio.run(burst()) if tokens is not None]


def ledger_rows(live, team: str) -> list[dict]:
    """The usage ledger's rows of one team, read from the embedded server's SQLite database."""
    with sqlite3.connect(live.work_dir / "var" / "db.sqlite3") as db:
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute(
            "select u.* from teams_usagerecord u join teams_team t on t.id = u.team_id where t.name = ?", (team,))]


def wait_for_rows(live, team: str, count: int, timeout: float = 20.0, keep=None) -> list[dict]:
    """At least `count` ledger rows of the team (the ledger writes in batches); `keep`: only rows it passes."""
    deadline = time.monotonic() + timeout
    while len(rows := [row for row in ledger_rows(live, team) if keep is None or keep(row)]) < count:
        assert time.monotonic() < deadline, f"ledger of {team} has {len(rows)} rows, expected {count}"
        time.sleep(0.2)
    return rows
