"""deploy/: supervisord runs the web side and two workers, and brings back a worker killed with -9."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from .conftest import TINY_MODEL
from .helpers.catalog import wait_until as wait_for
from .live_server import ROOT, ManagedProcess, base_env, free_port
from .services import RedisServer, require_binary

pytestmark = pytest.mark.scale_out
SUPERVISE = ROOT / "deploy" / "supervise"


def ctl(env: dict[str, str], *args: str) -> str:
    return subprocess.run([str(SUPERVISE), "ctl", *args], env=env, capture_output=True, text=True, timeout=30).stdout


def worker_pid(env: dict[str, str], name: str) -> int:
    """The pid supervisord reports for a RUNNING program, else 0."""
    status = ctl(env, "status", name)
    if "RUNNING" not in status:
        return 0
    return int(ctl(env, "pid", name).strip() or 0)


def complete(base_url: str, key: str) -> httpx.Response:
    return httpx.post(f"{base_url}/v1/completions", headers={"Authorization": f"Bearer {key}"}, timeout=120,
                      json={"model": TINY_MODEL, "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0})


def test_supervisord_restarts_a_killed_worker(hf_cache, tmp_path):
    require_binary(str(Path(sys.executable).parent / "supervisord"))
    redis = RedisServer(tmp_path)
    port = free_port()
    env = base_env(hf_cache, tmp_path, CHANNEL_LAYER_URL=redis.url, INFERENCE_PYTHON=sys.executable,
                   INFERENCE_PORT=str(port), INFERENCE_WORKERS="2", INFERENCE_SUPERVISOR_DIR=str(tmp_path / "sv"),
                   INFERENCE_WORKER_ACK_TIMEOUT="5")
    supervisor = ManagedProcess([str(SUPERVISE)], env, tmp_path / "supervisord.out", python=False)
    base_url = f"http://127.0.0.1:{port}"
    try:
        key_file = Path(env["INFERENCE_KEY_DIR"]) / f"{port}.key"
        def up() -> bool:  # the key file is written before the port listens
            try:
                return key_file.exists() and httpx.get(f"{base_url}/health", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, timeout=90, what="web and a worker to be up")
        key = key_file.read_text().strip()
        pids = {name: wait_for(lambda name=name: worker_pid(env, name), 60, f"{name} RUNNING")
                for name in ("worker:worker-0", "worker:worker-1")}
        assert complete(base_url, key).status_code == 200

        os.kill(pids["worker:worker-0"], signal.SIGKILL)
        new_pid = wait_for(lambda: (p := worker_pid(env, "worker:worker-0")) not in (0, pids["worker:worker-0"]) and p,
                           timeout=30, what="supervisord to start worker-0 again")
        # Only the restarted worker is left: a clean stop of the other marks it stopped, so every job
        # now has to be served by the new process.
        ctl(env, "stop", "worker:worker-1")
        log = tmp_path / "sv" / "worker-0.log"
        wait_for(lambda: log.read_text(errors="replace").count("listening on channel") >= 2, 60,
                 "the restarted worker to listen")
        response = wait_for(lambda: (r := complete(base_url, key)).status_code == 200 and r, 30,
                            "a completion served by the restarted worker")
        assert response.json()["choices"][0]["text"]
        assert f":{new_pid} listening on channel" in log.read_text(errors="replace")
        wait_for(lambda: f"finished {response.json()['id']}" in log.read_text(errors="replace"), 10,
                 "the restarted worker's log to show the job")
    finally:
        ctl(env, "shutdown")
        try:
            supervisor.process.wait(30)
        except subprocess.TimeoutExpired:
            pass
        supervisor.stop()
        redis.stop()
