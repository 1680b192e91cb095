"""/v1/models, /health, API keys and `serve`'s key file."""
from __future__ import annotations

import stat
import subprocess
import sys

import httpx
import openai
import pytest

from .conftest import TINY_MODEL
from .live_server import ROOT, LiveServer, base_env


def test_health_is_open(server):
    server.wait_healthy()  # readiness: a fresh server warms its engine first (tests/test_readiness.py)
    response = httpx.get(f"{server.base_url}/health")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


def test_models_lists_the_cached_causal_lms(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [TINY_MODEL]
    assert models.data[0].object == "model"
    assert client.models.retrieve(TINY_MODEL).id == TINY_MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nobody/nothing")


def test_models_needs_a_key(server):
    assert httpx.get(f"{server.base_url}/v1/models").status_code == 401


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer sk-inf-wrong"}, {"Authorization": "Basic eDp5"}])
def test_a_completion_without_a_valid_key_is_a_401_that_says_how_to_authenticate(server, headers):
    answer = httpx.post(f"{server.base_url}/v1/completions", headers=headers, timeout=30,
                        json={"model": TINY_MODEL, "prompt": "Hi", "max_tokens": 1})
    assert answer.status_code == 401
    assert answer.headers["WWW-Authenticate"] == 'Bearer realm="api"'
    assert answer.json()["error"]["type"] == "authentication_error"


def test_serve_writes_its_key_to_an_owner_only_file(server):
    mode = stat.S_IMODE(server.key_file.stat().st_mode)
    assert mode == 0o600
    assert server.key.startswith("sk-inf-")
    # A redirected stdout is a log: it names the key file, never the key (printed only to a terminal).
    assert server.key not in server.log() and str(server.key_file) in server.log()


def test_create_api_key_prints_a_working_key(server):
    env = base_env(server.work_dir.parent / "unused", server.work_dir)
    result = subprocess.run([sys.executable, "manage.py", "create_api_key", "alice"], cwd=ROOT, env=env,
                            capture_output=True, text=True, check=True)
    raw_key = result.stdout.strip()
    assert raw_key.startswith("sk-inf-") and raw_key != server.key
    response = httpx.get(f"{server.base_url}/v1/models", headers={"Authorization": f"Bearer {raw_key}"})
    assert response.status_code == 200
    db = (server.work_dir / "var" / "db.sqlite3").read_bytes()
    assert raw_key.encode() not in db  # stored only as a hash


def test_no_auth_serves_without_a_key_and_warns(hf_cache, tmp_path):
    live = LiveServer(base_env(hf_cache, tmp_path), tmp_path, extra_args=("--no-auth",))
    try:
        response = httpx.post(f"{live.base_url}/v1/completions", json={"model": TINY_MODEL, "prompt": "hi", "max_tokens": 2},
                              timeout=60)
        assert response.status_code == 200
        assert response.json()["usage"]["completion_tokens"] == 2
        assert "authentication is OFF" in live.log()
        assert not live.key_file.exists()
    finally:
        live.stop()


def test_serve_builds_a_model_when_the_cache_has_none(tmp_path):
    empty_cache = tmp_path / "empty-cache"
    live = LiveServer(base_env(empty_cache, tmp_path), tmp_path)
    try:
        models = httpx.get(f"{live.base_url}/v1/models", headers=live.headers).json()["data"]
        assert [m["id"] for m in models] == ["local/tiny-llama"]
        response = httpx.post(f"{live.base_url}/v1/completions", headers=live.headers,
                              json={"model": "local/tiny-llama", "prompt": "hi", "max_tokens": 2}, timeout=60)
        assert response.status_code == 200
    finally:
        live.stop()
