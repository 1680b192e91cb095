"""The servers under test, each started as its own process on a free port."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.live_server import ROOT, LiveServer, ManagedProcess, base_env, free_port


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """Resident memory of a process (`VmHWM`: its peak so far); the peer forks nothing, ours is one process."""
    total = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            total += int(line.split()[1])
    return round(total / 1024, 1)


class GitRef:
    """A detached worktree of another git ref of this repository, to measure its server in the same run."""

    def __init__(self, ref: str, where: Path) -> None:
        self.root = where
        subprocess.run(["git", "worktree", "add", "--detach", str(where), ref], cwd=ROOT, check=True,
                       capture_output=True)

    def remove(self) -> None:
        subprocess.run(["git", "worktree", "remove", "--force", str(self.root)], cwd=ROOT, capture_output=True)


class OurServer:
    """`manage.py serve --no-auth`: the embedded default, one process (from `root`: another checkout)."""

    def __init__(self, hf_cache: Path, work_dir: Path, root: Path | None = None, device: str = "cpu", dtype: str = "auto",
                 **env: str) -> None:
        work_dir.mkdir(parents=True, exist_ok=True)
        env.setdefault("INFERENCE_DEVICE", device)
        env.setdefault("INFERENCE_DTYPE", dtype)
        env.setdefault("INFERENCE_WORKER_ACK_TIMEOUT", "120")  # the first job imports torch: slow on a busy machine
        self.server = LiveServer(base_env(hf_cache, work_dir, **env), work_dir, extra_args=("--no-auth",), name="ours",
                                 **({"root": root} if root else {}))
        self.base_url = f"{self.server.base_url}/v1"
        self.pid = self.server.process.pid

    def stop(self) -> None:
        self.server.stop()


class PeerServer:
    """`transformers serve --continuous-batching MODEL` from the bench's environment."""

    def __init__(self, hf_cache: Path, work_dir: Path, model: str) -> None:
        work_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        cli = Path(sys.executable).parent / "transformers"
        command = [str(cli), "serve", "--continuous-batching", "--host", "127.0.0.1", "--port", str(port), model]
        self.process = ManagedProcess(command, base_env(hf_cache, work_dir), work_dir / "peer.log", python=False)
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.pid = self.process.process.pid
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.5)
        raise TimeoutError(self.process.log())

    def stop(self) -> None:
        self.process.stop()


class ScaleOut:
    """Web process + two `run_worker` processes meeting through a private redis-server."""

    def __init__(self, hf_cache: Path, work_dir: Path, workers: int = 2, auth: bool = False, **env_extra: str) -> None:
        from tests.services import RedisServer  # here: it imports pytest, which a GPU machine's image may lack

        work_dir.mkdir(parents=True, exist_ok=True)
        self.redis = RedisServer(work_dir)
        # The workers share this machine's cores: each gets its part, not torch's default of all of them.
        threads = str(max(1, (os.cpu_count() or 1) // workers))
        env = base_env(hf_cache, work_dir, CHANNEL_LAYER_URL=self.redis.url,
                       **{"INFERENCE_TORCH_THREADS": threads, **env_extra})
        self.web = LiveServer(env, work_dir, extra_args=("--no-worker",) if auth else ("--no-auth", "--no-worker"),
                              name="web")
        self.workers = []
        for index in range(workers):
            worker = ManagedProcess(["manage.py", "run_worker"], env, work_dir / f"worker{index}.log")
            worker.wait_for_log("listening on channel")
            self.workers.append(worker)
        self.base_url = f"{self.web.base_url}/v1"

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.web.stop()
        self.redis.stop()
