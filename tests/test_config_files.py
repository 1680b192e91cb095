"""`serve --config server.yaml` and `client --config client.yaml`: the file applies, flags win, unknown keys fail."""
from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest
import yaml

from .conftest import TINY_MODEL
from .live_server import ROOT, LiveServer, base_env


@pytest.fixture(scope="module")
def configured(hf_cache, reference, tmp_path_factory):
    """A server whose config file sets a port (overridden by --port), no auth, and the model's defaults."""
    work = tmp_path_factory.mktemp("configured")
    prompt = reference.encode("Once upon a time")
    free = reference.decode(reference.greedy(prompt, 24))
    stop = free[len(free) // 2: len(free) // 2 + 3]
    config = {"port": 1, "auth": False, "batching": {"max-num-seqs": 4, "prefill-share": 0.75},
              "models": [{"name": TINY_MODEL, "preload": True, "stop": [stop],
                          "generation-defaults": {"temperature": 0}}]}
    (work / "server.yaml").write_text(yaml.safe_dump(config))
    live = LiveServer(base_env(hf_cache, work), work, ("--config", str(work / "server.yaml")))
    yield live, free, stop
    live.stop()


def test_the_server_file_sets_model_defaults_and_auth_while_flags_win(configured):
    live, free, stop = configured
    assert live.port != 1  # --port (from the test harness) overrode the file's port
    response = httpx.post(f"{live.base_url}/v1/completions", timeout=120,  # no key: auth is off in the file
                          json={"model": TINY_MODEL, "prompt": "Once upon a time", "max_tokens": 24})
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    # temperature 0 and the stop sequence come from the file; the text ends before the stop string
    assert (choice["text"], choice["finish_reason"]) == (free[: free.index(stop)], "stop")
    sent_stop = httpx.post(f"{live.base_url}/v1/completions", timeout=120, json={
        "model": TINY_MODEL, "prompt": "Once upon a time", "max_tokens": 24, "stop": ["\u2603"]}).json()
    assert sent_stop["choices"][0]["text"] == free  # a request's own stop replaces the default


def run_manage(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "INFERENCE_API_KEY")}
    env.update(DJANGO_SETTINGS_MODULE="inference_site.settings", HF_HUB_OFFLINE="1", **(env_extra or {}))
    return subprocess.run([sys.executable, "manage.py", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=180, env=env, input="")


def test_the_client_file_sets_url_model_and_sampling_while_flags_win(configured, tmp_path):
    live, free, _ = configured
    config = {"url": f"{live.base_url}/v1", "model": TINY_MODEL, "max-tokens": 3, "temperature": 0,
              "echo": False, "stop": ["\u2603"]}
    (tmp_path / "client.yaml").write_text(yaml.safe_dump(config))
    env = {"INFERENCE_VAR_DIR": str(tmp_path / "var"), "INFERENCE_KEY_DIR": str(tmp_path / "keys")}
    result = run_manage("client", "--config", str(tmp_path / "client.yaml"), "--completion", "Once upon a time",
                        "--max-tokens", "24", env_extra=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == free + "\n"


@pytest.mark.parametrize("command, content, named", [
    ("serve", {"port": 8000, "batching": {"max_num_seq": 4}}, "batching.max_num_seq"),
    ("serve", {"models": [{"name": TINY_MODEL, "temprature": 0.5}]}, "models[0].temprature"),
    ("serve", {"auth": "yes"}, "auth"),
    ("client", {"url": "http://127.0.0.1:1/v1", "max_token": 5}, "max_token"),
])
def test_unknown_or_mistyped_keys_stop_the_command_and_are_named(tmp_path, command, content, named):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(content))
    env = {"INFERENCE_VAR_DIR": str(tmp_path / "var"), "INFERENCE_KEY_DIR": str(tmp_path / "keys")}
    result = run_manage(command, "--config", str(tmp_path / "config.yaml"), "--completion", "x", env_extra=env) \
        if command == "client" else run_manage(command, "--config", str(tmp_path / "config.yaml"), env_extra=env)
    assert result.returncode != 0
    assert named in result.stderr and "Traceback" not in result.stderr, result.stderr
