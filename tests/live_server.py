"""Real server processes for the tests: `manage.py serve` / `run_worker` on free ports."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ManagedProcess:
    """A child process whose output goes to a log file the test can read."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path, python: bool = True, cwd: Path = ROOT) -> None:
        """`args` run under this Python (`python=False`: `args` is the whole command) in `cwd`."""
        self.log_path = log_path
        self.env = env  # what it runs with (tests/helpers/admin.py runs manage.py against its database)
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, *args] if python else args, cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log():
                return
            if self.process.poll() is not None:
                raise RuntimeError(f"process exited ({self.process.returncode}):\n{self.log()}")
            time.sleep(0.05)
        raise TimeoutError(f"{text!r} not in log after {timeout}s:\n{self.log()}")

    def kill(self) -> None:
        """A crash, not a stop: SIGKILL to the whole group, no graceful drain."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        self._log.close()


def base_env(hf_cache: Path, work_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERENCE_", "CHANNEL_LAYER", "DATABASE_URL"))}
    env.update(
        HF_HUB_CACHE=str(hf_cache),
        HF_HUB_OFFLINE="1",
        INFERENCE_VAR_DIR=str(work_dir / "var"),
        INFERENCE_KEY_DIR=str(work_dir / "keys"),
        PYTHONUNBUFFERED="1",
        DJANGO_SETTINGS_MODULE="inference_site.settings",
    )
    env.update(extra)
    return env


class LiveServer(ManagedProcess):
    """`manage.py serve` on a free port; knows its URL and the API key it wrote."""

    def __init__(self, env: dict[str, str], work_dir: Path, extra_args: tuple[str, ...] = (), name: str = "serve",
                 root: Path = ROOT, launcher: tuple[str, ...] = ()) -> None:
        """`root`: the checkout whose manage.py runs (the benchmark measures another git ref that way);
        `launcher`: a command that runs the rest (a shell that lowers `ulimit -n` first)."""
        self.port = free_port()
        self.work_dir = work_dir
        args = ["manage.py", "serve", "--port", str(self.port), *extra_args]
        super().__init__([*launcher, sys.executable, *args] if launcher else args, env, work_dir / f"{name}.log",
                         python=not launcher, cwd=root)
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._wait_ready()
        key_file = Path(env["INFERENCE_KEY_DIR"]) / f"{self.port}.key"
        self.key = key_file.read_text().strip() if key_file.exists() else "no-auth"
        self.key_file = key_file

    def _wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited ({self.process.returncode}):\n{self.log()}")
            try:
                if httpx.get(f"{self.base_url}/health/live", timeout=1).status_code == 200:
                    return
                # A server from before /health/live (bench: --baseline-ref): its model list answers once it is up.
                if httpx.get(f"{self.base_url}/v1/models", timeout=1).status_code in (200, 401):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not ready:\n{self.log()}")

    def wait_healthy(self, timeout: float = 120.0) -> list[str]:
        """Poll /health (readiness: the engine warmed up, the pinned model loaded) until 200; the reasons it
        gave meanwhile."""
        reasons: list[str] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            response = httpx.get(f"{self.base_url}/health", timeout=10)
            if response.status_code == 200:
                return reasons
            reasons += response.json().get("reasons", [])
            time.sleep(0.1)
        raise TimeoutError(f"/health never said ok: {reasons[-3:]}")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


def clients(server: LiveServer):
    """The real openai SDK's sync and async clients for a live server (no retries: a failure shows)."""
    from openai import AsyncOpenAI, OpenAI

    options = dict(base_url=f"{server.base_url}/v1", api_key=server.key, max_retries=0, timeout=120)
    return OpenAI(**options), AsyncOpenAI(**options)
