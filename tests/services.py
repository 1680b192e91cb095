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
        binary = require_binary("redis-server")
        self.port = free_port()
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(work_dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.url = f"redis://127.0.0.1:{self.port}/0"
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
