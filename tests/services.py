"""Real backing services for scale-out tests: a private redis-server (and PostgreSQL) on free ports."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from .live_server import free_port


def require_binary(name: str, *candidates: str) -> str:
    """The binary's path; skip when absent, unless CI demands the scale-out tests run."""
    for candidate in (name, *candidates):
        found = shutil.which(candidate) or (candidate if os.path.exists(candidate) else None)
        if found:
            return found
    if os.environ.get("REQUIRE_SCALE_OUT") == "1":
        pytest.fail(f"{name} is required (REQUIRE_SCALE_OUT=1) but not installed")
    pytest.skip(f"{name} not installed")


class RedisServer:
    def __init__(self, work_dir: Path) -> None:
        self.binary = require_binary("redis-server")
        self.work_dir = work_dir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.start()

    def start(self) -> None:
        """(Re)start on the same port, empty (no persistence: a restart loses every key, as in production)."""
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.work_dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self._wait()

    def _wait(self) -> None:
        import redis

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if redis.Redis(port=self.port).ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise TimeoutError("redis-server did not start")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


class PostgresServer:
    """A throwaway PostgreSQL cluster (initdb + pg_ctl) on a free port, trust auth on loopback."""

    def __init__(self) -> None:
        import glob
        import tempfile

        # Not under pytest's tmp dir: that is private to root, and the server runs as `postgres`.
        work_dir = self.work_dir = Path(tempfile.mkdtemp(prefix="inference-pg-"))
        bin_dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
        initdb = require_binary(*(f"{d}/initdb" for d in reversed(bin_dirs)), "initdb")
        self.bin_dir = Path(initdb).parent
        self.port = free_port()
        self.data_dir = work_dir / "pgdata"
        self.socket_dir = work_dir / "pgsock"
        self.socket_dir.mkdir()
        self.as_user: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            for path in (work_dir, self.socket_dir):
                shutil.chown(path, "postgres", "postgres")
            os.chmod(work_dir, 0o755)
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self._run(initdb, "-D", str(self.data_dir), "-A", "trust", "-U", "postgres", "--no-sync")
        self.start_server()
        self._run(str(self.bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "inference")
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/inference"

    def _run(self, *args: str) -> None:
        subprocess.run([*self.as_user, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def start_server(self) -> None:
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-w", "-l", str(self.work_dir / "pg.log"),
                  "-o", f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1 -c fsync=off", "start")

    def stop_server(self) -> None:
        """Stop at once (clients' connections break), keeping the data for start_server()."""
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-m", "immediate", "stop")

    def stop(self) -> None:
        self.stop_server()
        shutil.rmtree(self.work_dir, ignore_errors=True)
