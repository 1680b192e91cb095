"""The seeds' options: transformers chat, the seeds' own client, unchanged."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import httpx
import pytest

from ..conftest import TINY_MODEL
from ..helpers.seed_options import BNB, REMOTE, complete, wait_loaded
from ..teams_setup import make_teams


def transformers_chat(server, model: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The installed transformers' `chat` CLI: two turns typed on stdin, greedy via its generate flags (each
    answer that stops at max_new_tokens asks whether to go on: "n"; spare "!exit"s if one was not asked)."""
    cli = shutil.which("transformers", path=os.path.dirname(sys.executable)) or "transformers"
    return subprocess.run([cli, "chat", model, server.base_url, "max_new_tokens=6", "do_sample=False"],
                          input="Hello there\nn\nAnd again\nn\n!exit\n!exit\n!exit\n", capture_output=True, text=True, timeout=180,
                          env={**{k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"},  # its client refuses
                               "COLUMNS": "200", "TERM": "dumb", **env})                      # even a local URL offline


def chat_requests(server) -> int:
    return server.log().count("/v1/chat/completions")


@pytest.mark.parametrize("which", ["keyed", "open_server"])
def test_transformers_chat_works_unchanged(which, request):
    """With auth on it sends its key (HF_TOKEN) to the API; its /load_model carries none, and is answered
    for the pinned model, which is loaded."""
    server = request.getfixturevalue(which)
    model = REMOTE if which == "keyed" else "local/my-model"
    wait_loaded(server, model)
    before = chat_requests(server)
    done = transformers_chat(server, model, {"HF_TOKEN": server.key} if which == "keyed" else {})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"{model} was already loaded" in done.stdout
    assert f"<{model}>" in done.stdout  # its answers' heading, once per turn
    # Two turns; an answer that ended on a stop (the open server's --stop-sequences) rather than the length asks
    # no question, and its "n" goes as one more turn.
    assert 2 <= chat_requests(server) - before <= 4, server.log()[-3000:]


def load_model(server, body: dict, key: str | None = None) -> httpx.Response:
    return httpx.post(f"{server.base_url}/load_model", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {key}"} if key else {})


def test_load_model_tells_a_caller_without_the_right_no_more_than_a_named_loaded_models_readiness(keyed):
    """The deliberate exception (docs/teams.md): `ready` for a loaded model asked by name, nothing else; a model
    some team may not use is not told of without a key, nor to a key of a team that may not use it."""
    assert complete(keyed, model=TINY_MODEL).status_code == 200  # loaded now, beside the pinned model
    ready = load_model(keyed, {"model": REMOTE})
    assert ready.status_code == 200 and json.loads(ready.text.split("data: ", 1)[1]) == {
        "status": "ready", "model": REMOTE, "cached": True}
    for body in ({"model": BNB}, {}, {"model": REMOTE, "stream": True}, {"model": "local/" + "x" * 400}):
        assert load_model(keyed, body).status_code == 401, body  # not loaded; the pinned model unnamed; more asked
    secrets = make_teams(keyed.env, teams={"narrow": ["--models", REMOTE]}, keys={"narrow": ["--team", "narrow"]})
    assert load_model(keyed, {"model": TINY_MODEL}).status_code == 401  # loaded, but not every team's
    assert load_model(keyed, {"model": REMOTE}).status_code == 200  # still every team's
    refused = load_model(keyed, {"model": TINY_MODEL}, key=secrets["narrow"])
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"  # as if unknown
    assert load_model(keyed, {"model": REMOTE}, key=secrets["narrow"]).status_code == 200
