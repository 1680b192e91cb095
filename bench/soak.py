"""Soak under faults: scale-out (web + 2 workers under deploy/supervise, Redis, PostgreSQL),
N concurrent streaming clients for M minutes, one worker killed with -9 and Redis restarted
during it, and every failpoint firing at random in every process throughout (`--failpoints`).
Reports outcomes by kind, the longest stall any client saw (request to first byte, or between two
SSE lines), stalls over the 5 s bound, RSS of every process at start and end, and whether every
answer a client got whole has its ledger row with the same tokens (no usage lost).

    python -m bench.soak                      # 64 clients, 5 minutes
    python -m bench.soak --minutes 1 --concurrency 16
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import httpx

from bench.run import ROOT, ensure_model, positive_int
from bench.servers import rss_mb
from bench.sse import stream_once
from tests.live_server import ManagedProcess, base_env, free_port
from tests.services import PostgresServer, RedisServer

SUPERVISE = ROOT / "deploy" / "supervise"
T = TypeVar("T")
STALL_BOUND_SECONDS = 5.0
# Every failpoint at random through the run (percent per pass): a step's publish or loop turn fails
# now and then, as does a send onto the layer, a media read, a ledger write, a heartbeat, a handoff.
RANDOM_FAULTS = ("engine.loop=raise%0.05,engine.publish=raise%0.01,bridge.send=raise%0.05,media.read=raise%5,"
                 "ledger.write=raise%10,worker.heartbeat=raise%10,web.handoff=delay(200)%1")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="local/tiny-llama")
    parser.add_argument("--size", default="tiny", choices=["tiny", "small"], help="size to build if the model is missing")
    parser.add_argument("--concurrency", type=positive_int, default=64)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--max-tokens", type=positive_int, default=64)
    parser.add_argument("--failpoints", default=RANDOM_FAULTS,
                        help="INFERENCE_FAILPOINTS for every process (default: every failpoint at random; '' for none)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "soak.json")
    return parser.parse_args()


class Deployment:
    """Redis, PostgreSQL, and deploy/supervise running the web side and 2 workers."""

    def __init__(self, cache: Path, work: Path, failpoints: str = "", **env: str) -> None:
        self.redis = RedisServer(work)
        self.postgres = PostgresServer()
        self.port = free_port()
        self.env = base_env(cache, work, CHANNEL_LAYER_URL=self.redis.url, DATABASE_URL=self.postgres.url,
                            INFERENCE_PYTHON=sys.executable, INFERENCE_PORT=str(self.port), INFERENCE_WORKERS="2",
                            INFERENCE_SUPERVISOR_DIR=str(work / "sv"), INFERENCE_TORCH_THREADS="1",
                            INFERENCE_FAILPOINTS=failpoints, **env)
        self.supervisor = ManagedProcess([str(SUPERVISE)], self.env, work / "supervisord.out", python=False)
        self.base_url = f"http://127.0.0.1:{self.port}"
        key_file = Path(self.env["INFERENCE_KEY_DIR"]) / f"{self.port}.key"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if key_file.exists() and httpx.get(f"{self.base_url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise TimeoutError("the deployment did not become healthy")
        self.headers = {"Authorization": f"Bearer {key_file.read_text().strip()}"}

    def ctl(self, *args: str) -> str:
        return subprocess.run([str(SUPERVISE), "ctl", *args], env=self.env, capture_output=True, text=True,
                              timeout=30).stdout

    def pids(self) -> dict[str, int]:
        return {name: int(self.ctl("pid", name).strip() or 0) for name in ("web", "worker:worker-0", "worker:worker-1")}

    def rss(self) -> dict[str, float]:
        return {name: rss_mb(pid) for name, pid in self.pids().items() if pid}

    def stop(self) -> None:
        self.ctl("shutdown")
        try:
            self.supervisor.process.wait(60)
        except subprocess.TimeoutExpired:
            pass
        self.supervisor.stop()
        self.redis.stop()
        self.postgres.stop()


async def keep_sending(concurrency: int, seconds: float, one: Callable[[httpx.AsyncClient, int], Awaitable[T]],
                       ok: Callable[[T], bool]) -> list[T]:
    """`concurrency` clients each sending `one(http, index)` after the other for `seconds`; every outcome."""
    deadline = time.monotonic() + seconds
    outcomes: list[T] = []

    async def client(index: int) -> None:
        async with httpx.AsyncClient(timeout=120) as http:
            while time.monotonic() < deadline:
                outcome = await one(http, index)
                outcomes.append(outcome)
                if not ok(outcome):
                    await asyncio.sleep(0.5)  # as a client honouring Retry-After would, briefly

    await asyncio.gather(*[client(i) for i in range(concurrency)])
    return outcomes


async def clients(deployment: Deployment, model: str, concurrency: int, seconds: float, max_tokens: int) -> list:
    url = f"{deployment.base_url}/v1/completions"

    async def one(http: httpx.AsyncClient, index: int):
        body = {"model": model, "prompt": f"Story {index}:", "max_tokens": max_tokens, "ignore_eos": True,
                "stream_options": {"include_usage": True}}
        return await stream_once(http, url, deployment.headers, body)

    return await keep_sending(concurrency, seconds, one, lambda outcome: outcome.kind == "ok")


async def faults(deployment: Deployment, seconds: float, log: list) -> None:
    """A worker killed with -9 at a third of the run, Redis down for 3 s at two thirds."""
    await asyncio.sleep(seconds / 3)
    pid = deployment.pids()["worker:worker-0"]
    os.kill(pid, signal.SIGKILL)
    log.append({"at_s": round(seconds / 3, 1), "fault": f"kill -9 worker-0 (pid {pid})"})
    await asyncio.sleep(seconds / 3)
    deployment.redis.stop()
    log.append({"at_s": round(2 * seconds / 3, 1), "fault": "redis-server stopped"})
    await asyncio.sleep(3)
    deployment.redis.start()
    log.append({"at_s": round(2 * seconds / 3 + 3, 1), "fault": "redis-server started"})


def warm_up(deployment: Deployment, model: str) -> None:
    """Both workers import torch and load the model before the clock starts (a cold start is not a fault)."""
    async def run() -> None:
        async with httpx.AsyncClient(timeout=300) as http:
            body = {"model": model, "prompt": "warm", "max_tokens": 2}
            for _ in range(3):
                await asyncio.gather(*[stream_once(http, f"{deployment.base_url}/v1/completions", deployment.headers, body)
                                       for _ in range(8)])

    asyncio.run(run())


def reconcile_usage(deployment: Deployment, outcomes: list, wait: float = 60.0) -> dict:
    """Every answer a client got whole (its usage seen) against the ledger in PostgreSQL: each must have its
    row with the same completion tokens. The ledger writes in batches and replays its spool after a
    failed write, so the rows may take a few seconds."""
    import psycopg

    served = {o.request_id: o.completion_tokens for o in outcomes if o.kind == "ok" and o.completion_tokens is not None}
    deadline = time.monotonic() + wait
    while True:
        with psycopg.connect(deployment.postgres.url) as db:
            rows = dict(db.execute("select request_id, completion_tokens from teams_usagerecord").fetchall())
        missing = [rid for rid in served if rid not in rows]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(2)
    mismatched = [rid for rid, tokens in served.items() if rid in rows and rows[rid] != tokens]
    return {"answers_with_usage": len(served), "client_completion_tokens": sum(served.values()),
            "ledger_completion_tokens_of_those": sum(rows[rid] for rid in served if rid in rows),
            "rows_missing": len(missing), "rows_mismatched": len(mismatched), "ledger_rows": len(rows)}


def main() -> None:
    args = parse_args()
    from huggingface_hub import constants

    cache = Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE)
    ensure_model(args.model, args.size, cache)
    work = Path(tempfile.mkdtemp(prefix="soak-"))
    deployment = Deployment(cache, work, args.failpoints)
    try:
        warm_up(deployment, args.model)
        rss_start = deployment.rss()
        seconds = args.minutes * 60
        fault_log: list = []

        async def run() -> list:
            outcomes, _ = await asyncio.gather(clients(deployment, args.model, args.concurrency, seconds,
                                                       args.max_tokens), faults(deployment, seconds, fault_log))
            return outcomes

        started = time.monotonic()
        outcomes = asyncio.run(run())
        wall = time.monotonic() - started
        rss_end = deployment.rss()
        usage = reconcile_usage(deployment, outcomes)
    finally:
        deployment.stop()
    kinds = Counter(outcome.kind for outcome in outcomes)
    report = {
        "concurrency": args.concurrency, "minutes": args.minutes, "model": args.model, "wall_s": round(wall, 1),
        "requests": len(outcomes), "outcomes": dict(kinds.most_common()),
        "tokens_per_s": round(sum(o.tokens for o in outcomes) / wall, 1),
        "longest_stall_s": round(max(o.longest_gap for o in outcomes), 2),
        f"stalls_over_{STALL_BOUND_SECONDS:g}s": sum(o.longest_gap > STALL_BOUND_SECONDS for o in outcomes),
        # Each stall over the bound: when it ended (s into the run), how long, the outcome, the line that ended it.
        "stalls": [{"ended_at_s": round(o.gap_ended - started, 1), "seconds": round(o.longest_gap, 2), "kind": o.kind,
                    "ended_by": o.first_line} for o in outcomes if o.longest_gap > STALL_BOUND_SECONDS],
        "rss_mb_start": rss_start, "rss_mb_end": rss_end, "faults": fault_log, "failpoints": args.failpoints,
        "usage": usage,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
