"""Real server processes for the tests: `manage.py serve` / `run_worker` on free ports."""
from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


ZYGOTE_SOCKET = "TESTS_ZYGOTE_SOCKET"  # set by a test for a bench run it starts: fork from the session's zygote

# What a test may set per process without a fresh interpreter: read at run time, never at import (the Hugging
# Face cache path is re-read in each forked child: tests/zygote.py); KMP_* are Intel OpenMP's, which torch's CPU
# build does not load (sklearn and joblib set them when the test process imports them).
PER_PROCESS_ENV = ("INFERENCE_", "CHANNEL_LAYER", "DATABASE_URL", "HF_HUB_CACHE", "DJANGO_SETTINGS_MODULE",
                   "DJANGO_SUPERUSER_", "PYTHONUNBUFFERED", "PYTEST_CURRENT_TEST", "SOAK_", "TOKENIZERS_PARALLELISM",
                   "KMP_", "PROMETHEUS_MULTIPROC_DIR", "LOG_FORMAT", ZYGOTE_SOCKET, "TESTS_FULL_SHUTDOWN")


def _shared_env(env: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in env.items() if not key.startswith(PER_PROCESS_ENV)}


class Zygote:
    """tests/zygote.py for this test session: `manage.py` processes forked from a Python that has imported torch
    and transformers once (a fresh interpreter where the environment differs beyond PER_PROCESS_ENV)."""

    in_test_session = False  # tests/conftest.py sets it: bench runs import this module and start fresh servers
    _instance: Zygote | bool | None = None  # False: it failed to start

    @classmethod
    def get(cls) -> Zygote | None:
        """The test session's zygote (started on first use); in a bench run a test started, the zygote the
        test named in TESTS_ZYGOTE_SOCKET; None where processes start as users start them."""
        if os.environ.get("TESTS_FORK_SERVERS", "1") == "0":
            return None
        if cls._instance is None:
            attach_to = os.environ.get(ZYGOTE_SOCKET)
            if not cls.in_test_session and not attach_to:
                return None  # bench runs start their servers as users do
            try:
                cls._instance = cls.start() if cls.in_test_session else cls(Path(attach_to))
            except (OSError, RuntimeError, ValueError) as exc:  # no zygote: every process starts fresh, as before
                warnings.warn(f"tests/zygote.py did not start ({exc}); starting fresh interpreters")
                cls._instance = False
        return cls._instance if cls._instance and cls._instance.alive() else None

    @classmethod
    def start(cls) -> Zygote:
        socket_path = Path(tempfile.mkdtemp(prefix="zygote-")) / "socket"
        env = {**_shared_env(dict(os.environ)), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        log = open(socket_path.with_name("zygote.log"), "wb")
        process = subprocess.Popen([sys.executable, "-u", "-m", "tests.zygote", str(socket_path)], cwd=ROOT, env=env,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while b"zygote ready" not in socket_path.with_name("zygote.log").read_bytes():  # listening
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the zygote did not start: {socket_path.with_name('zygote.log').read_text()}")
            time.sleep(0.05)
        zygote = cls(socket_path, process)
        atexit.register(zygote.stop)
        return zygote

    def __init__(self, socket_path: Path, process: subprocess.Popen | None = None) -> None:
        """The zygote listening on `socket_path`: this process's own (`process`), or another's it was told of."""
        self.socket_path = socket_path
        self.process = process
        self.env = self.ask({"op": "env"})["env"]  # what it imported under: what a forked child may differ in

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        try:
            return self.ask({"op": "ping"}).get("ok", False)
        except OSError:
            return False

    def ask(self, request: dict) -> dict:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(str(self.socket_path))
            connection.sendall(json.dumps(request).encode() + b"\n")
            return json.loads(connection.makefile().readline())

    def can_fork(self, args: list[str], env: dict[str, str], cwd: Path) -> bool:
        return args[:1] == ["manage.py"] and Path(cwd) == ROOT and _shared_env(env) == _shared_env(self.env)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)


class ForkedProcess:
    """The parts of subprocess.Popen the tests use, for a process the zygote forked."""

    def __init__(self, zygote: Zygote, args: list[str], env: dict[str, str], cwd: Path, log_path: Path,
                 err_path: Path | None = None) -> None:
        self.zygote = zygote
        self.args = [sys.executable, *args]
        answer = zygote.ask({"op": "spawn", "argv": args, "env": env, "cwd": str(cwd), "log": str(log_path),
                             "err": str(err_path) if err_path else None})
        if "pid" not in answer:
            raise OSError(answer.get("error", answer))
        self.pid: int = answer["pid"]
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.ask({"op": "status", "pid": self.pid})["code"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def run_manage(args: list[str], env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
    """`python manage.py ARGS` to its end, as `subprocess.run(..., capture_output=True, text=True)` gives it
    (forked from the zygote where it can be)."""
    zygote = Zygote.get()
    if zygote is None or not zygote.can_fork(["manage.py", *args], env, ROOT):
        return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="manage-") as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        process = ForkedProcess(zygote, ["manage.py", *args], env, ROOT, out, err)
        code = process.wait(timeout)
        return subprocess.CompletedProcess(process.args, code, out.read_text() if out.exists() else "",
                                           err.read_text() if err.exists() else "")


class ManagedProcess:
    """A child process whose output goes to a log file the test can read."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path, python: bool = True, cwd: Path = ROOT,
                 fresh_interpreter: bool = False) -> None:
        """`args` run under this Python (`python=False`: `args` is the whole command) in `cwd`; `manage.py`
        commands are forked from the session's zygote unless `fresh_interpreter` (a test of a cold start)."""
        self.log_path = log_path
        self.env = env  # what it runs with (tests/helpers/admin.py runs manage.py against its database)
        self._log = open(log_path, "wb")
        zygote = None if fresh_interpreter or not python else Zygote.get()
        if zygote is not None and zygote.can_fork(args, env, cwd):
            try:
                self.process = ForkedProcess(zygote, args, env, cwd, log_path)
                return
            except OSError as exc:  # the zygote could not fork it: a fresh interpreter, as before
                warnings.warn(f"the zygote did not fork {args}: {exc}")
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


class MigratedDatabase:
    """One SQLite database migrated once per test session, copied into each embedded server's fresh var dir: a
    migration of a new database costs ~1.3 s of a start, and the suite starts ~100 of them. Tests of a cold
    start (`fresh_interpreter`) still migrate theirs, as a new user's first `serve` does."""

    _template: Path | None = None

    @classmethod
    def seed(cls, env: dict[str, str]) -> None:
        if "DATABASE_URL" in env or not Zygote.in_test_session or os.environ.get("TESTS_FORK_SERVERS") == "0":
            return
        var_dir = Path(env["INFERENCE_VAR_DIR"])
        if (var_dir / "db.sqlite3").exists():
            return
        if cls._template is None:
            template_dir = Path(tempfile.mkdtemp(prefix="migrated-"))
            subprocess.run([sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"], cwd=ROOT, check=True,
                           env={**base_env(template_dir, template_dir), "HF_HUB_CACHE": str(template_dir / "hub")},
                           capture_output=True)
            cls._template = template_dir / "var" / "db.sqlite3"
        var_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        shutil.copy(cls._template, var_dir / "db.sqlite3")


class LiveServer(ManagedProcess):
    """`manage.py serve` on a free port; knows its URL and the API key it wrote."""

    def __init__(self, env: dict[str, str], work_dir: Path, extra_args: tuple[str, ...] = (), name: str = "serve",
                 root: Path = ROOT, launcher: tuple[str, ...] = (), fresh_interpreter: bool = False) -> None:
        """`root`: the checkout whose manage.py runs (the benchmark measures another git ref that way);
        `launcher`: a command that runs the rest (a shell that lowers `ulimit -n` first)."""
        self.port = free_port()
        self.work_dir = work_dir
        if not fresh_interpreter and root == ROOT:
            MigratedDatabase.seed(env)
        args = ["manage.py", "serve", "--port", str(self.port), *extra_args]
        super().__init__([*launcher, sys.executable, *args] if launcher else args, env, work_dir / f"{name}.log",
                         python=not launcher, cwd=root, fresh_interpreter=fresh_interpreter)
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
