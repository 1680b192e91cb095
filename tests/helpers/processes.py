"""Worker processes and streamed completions for the fault and scale-out drills."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx

from ..live_server import LiveServer, ManagedProcess


def worker_processes(env: dict[str, str], work_dir: Path, count: int) -> list[ManagedProcess]:
    """`run_worker` processes, each listening."""
    workers = [ManagedProcess(["manage.py", "run_worker"], env, work_dir / f"worker{i}.log") for i in range(count)]
    for worker in workers:
        worker.wait_for_log("listening on channel")
    return workers


class Stream(threading.Thread):
    """A streamed completion; every SSE payload with its arrival time."""

    def __init__(self, server: LiveServer, model: str, max_tokens: int, url: str = "/v1/completions", **extra) -> None:
        super().__init__(daemon=True)
        self.server, self.url = server, url
        self.body = {"model": model, "prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True,
                     "stream": True, **extra}
        self.events: list[tuple[float, str]] = []
        self.status = 0

    def run(self) -> None:
        with httpx.stream("POST", self.server.base_url + self.url, headers=self.server.headers, json=self.body,
                          timeout=120) as response:
            self.status = response.status_code
            for line in response.iter_lines():
                if line.startswith("data: "):
                    self.events.append((time.monotonic(), line[len("data: "):]))

    def wait_for_tokens(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self.events) < count and time.monotonic() < deadline and self.is_alive():
            time.sleep(0.02)
        assert len(self.events) >= count, f"only {len(self.events)} events"
