"""A spool row the database refuses for good never holds up the others (real servers, real spool files):
rows of a key deleted while they sat in the spool are still billed to its team, a row no database
would take is set aside once in the dead-letter file (one ERROR line, a /metrics counter), the rest replay."""
from __future__ import annotations

import json
import sqlite3
import time

import httpx

from .conftest import TINY_MODEL
from .helpers.ledger import load
from .helpers.metrics import value
from .live_server import LiveServer, base_env
from .teams_setup import make_teams, manage


def complete(live: LiveServer, secret: str | None = None) -> dict:
    headers = {"Authorization": f"Bearer {secret}"} if secret else live.headers
    response = httpx.post(f"{live.base_url}/v1/completions", headers=headers, timeout=120,
                          json={"model": TINY_MODEL, "prompt": "Once upon a time", "max_tokens": 3, "temperature": 0})
    assert response.status_code == 200, response.text
    return response.json()


def rows(work) -> list[dict]:
    with sqlite3.connect(work / "var" / "db.sqlite3") as db:
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute(
            "select u.request_id, u.key_id, t.name as team from teams_usagerecord u "
            "left join teams_team t on t.id = u.team_id where u.status_code = 200")]


def test_a_poisoned_spool_row_is_dead_lettered_once_and_every_other_row_replays(hf_cache, tmp_path):
    env = base_env(hf_cache, tmp_path, INFERENCE_LEDGER_REPLAY_SECONDS="1")
    # The database takes no usage row while the first server runs: every row stays in the spool.
    first = LiveServer({**env, "INFERENCE_FAILPOINTS": "ledger.write=raise"}, tmp_path, name="first")
    try:
        load(first)  # the server has migrated the database by now
        secrets = make_teams(env, teams={"doomed": []}, keys={"doomed-key": ["--team", "doomed"]})
        ids = [complete(first, secrets["doomed-key"])["id"] for _ in range(2)] + [complete(first)["id"] for _ in range(2)]
    finally:
        first.stop()
    assert rows(tmp_path) == []
    # The key is deleted while its rows wait in the spool.
    manage(env, "shell", "-c", "from teams.models import APIKey; APIKey.objects.get(name='doomed-key').delete()")
    spools = list((tmp_path / "var" / "ledger-spool").glob("db-*"))
    assert len(spools) == 1, spools  # keyed by the database the rows belong to
    spooled = [json.loads(line) for path in spools[0].glob("usage-*.jsonl") for line in path.read_text().splitlines()]
    assert sorted(row["request_id"] for row in spooled) == sorted(ids)
    poison = {**spooled[0], "request_id": "cmpl-poison", "status_code": "not a status"}
    (spools[0] / "usage-1-1.jsonl").write_text(json.dumps(poison) + "\n")

    second = LiveServer(env, tmp_path, name="second")
    try:
        second.wait_for_log("refused by the database")
        deadline = time.monotonic() + 20
        while len(rows(tmp_path)) < 4 and time.monotonic() < deadline:
            time.sleep(0.2)
        billed = rows(tmp_path)
        assert sorted(row["request_id"] for row in billed) == sorted(ids)
        doomed = [row for row in billed if row["team"] == "doomed"]
        assert len(doomed) == 2 and all(row["key_id"] is None for row in doomed)  # still the team's usage
        time.sleep(2.5)  # two more replays: the poisoned row is not tried again
        letters = [json.loads(line) for line in (spools[0] / "dead-letter.jsonl").read_text().splitlines()]
        assert [letter["row"]["request_id"] for letter in letters] == ["cmpl-poison"]
        assert second.log().count("refused by the database") == 1
        assert list(spools[0].glob("usage-*.jsonl")) == []
        metrics = httpx.get(f"{second.base_url}/metrics", headers=second.headers, timeout=30).text
        assert value(metrics, "inference_usage_rows_dead_lettered_total", "") == 1
    finally:
        second.stop()


def test_spool_files_of_an_earlier_version_are_taken_into_this_databases_spool(tmp_path):
    """Rows an older server spooled into the spool folder itself (one spool for every database) are moved into
    this database's spool on start, so they replay here rather than sit unread."""
    from teams.ledger_dead_letter import database_spool_dir

    (tmp_path / "usage-123-456.jsonl").write_text('{"request_id": "r-1"}\n')
    (tmp_path / "journal-123-789.jsonl").write_text("")
    directory = database_spool_dir(tmp_path)
    assert sorted(p.name for p in directory.iterdir()) == ["journal-123-789.jsonl", "usage-123-456.jsonl"]
    assert not list(tmp_path.glob("*.jsonl"))
    assert database_spool_dir(tmp_path) == directory  # the same database, the same spool
