"""A model cache with several tiny models, and the manage.py / HTTP calls the catalog tests drive it with."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from workers.tiny.builders import build_non_causal_model, build_tiny_model

from ..live_server import ROOT, LiveServer, base_env


@pytest.fixture(scope="module")
def catalog_cache(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("catalog-cache")
    build_tiny_model("local/tiny-llama", cache_dir=cache)
    build_tiny_model("local/other", cache_dir=cache, seed=1)
    build_tiny_model("local/third", cache_dir=cache, seed=2)
    build_non_causal_model("local/encoder", cache_dir=cache)
    return cache


def catalog_env(cache: Path, work: Path, **extra: str) -> dict[str, str]:
    return base_env(cache, work, INFERENCE_HEARTBEAT_SECONDS="0.5", **extra)


def manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def set_fields(env: dict[str, str], repo_id: str, **fields) -> None:
    """Catalog settings written before a server starts, as an admin would have left them."""
    manage(env, "migrate", "--verbosity", "0")
    manage(env, "scan_cache")
    manage(env, "shell", "-c", f"from catalog.models import CachedModel as M; "
                               f"assert M.objects.filter(repo_id={repo_id!r}).update(**{fields!r}) == 1")


def load_events(server: LiveServer, model: str) -> list[dict]:
    with httpx.stream("POST", f"{server.base_url}/load_model", headers=server.headers, json={"model": model},
                      timeout=60) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]


def listed(server: LiveServer) -> dict[str, dict]:
    response = httpx.get(f"{server.base_url}/v1/models", headers=server.headers, timeout=30)
    assert response.status_code == 200
    return {m["id"]: m for m in response.json()["data"]}


def wait_until(check, timeout: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def complete(server: LiveServer, model: str) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/completions", headers=server.headers, timeout=60,
                      json={"model": model, "prompt": "Once upon a time", "max_tokens": 4})
