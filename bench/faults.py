"""`python -m bench.run --scenario faults`: a fault drill, and whether the ledger tells the truth about it.

The scale-out deployment (web + 2 workers under deploy/supervise, Redis, PostgreSQL) under `--concurrency`
streaming clients for `--seconds`; at each sixth of the run one fault: a worker killed with -9, Redis
stopped for 3 s, PostgreSQL stopped for 3 s, the web process killed with -9 (supervisord starts it again).
Every client request is kept as its client saw it: its id, its HTTP status and error code (or the error
event that ended its stream, or a stream cut off), the token ids it was sent. Then the ledger in PostgreSQL
is read (once its rows stop coming: spooled rows are replayed, a dead web process's open requests settled)
and the report prints requests sent vs ledger rows vs rows with the status, error code and tokens their
client saw. Requests that got no answer at all (the web process down) are counted apart: a row may exist
for one the dead process had taken (502 `server_lost`), or none if it never reached the server.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx

from .models import ensure_model, prepare_cache
from .soak import Deployment, keep_sending, warm_up

ROOT = Path(__file__).resolve().parent.parent
ERROR_STATUS = {"worker_lost": 503, "channel_layer_unavailable": 503, "database_unavailable": 503,
                "no_worker": 503, "queue_full": 503, "engine_fault": 500, "engine_dead": 503, "worker_timeout": 503}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run --scenario faults", description=__doc__)
    parser.add_argument("--model", default="local/tiny-llama")
    parser.add_argument("--size", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--max-tokens", type=int, default=200, help="long enough that a kill lands mid-stream")
    parser.add_argument("--quick", action="store_true", help="a short run that checks it works")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.concurrency, args.seconds, args.max_tokens = 6, 42.0, 160
    return args


@dataclass
class Seen:
    """One request as its client saw it."""

    request_id: str = ""
    status: int | None = None  # None: no answer at all
    code: str = ""  # the error's code (HTTP error, or the event that ended the stream)
    tokens: int = 0
    ended: str = ""  # "done", "event", "cut" (a 200 stream with neither), "http" (an error answer), "none"

    def expected(self) -> tuple[int, str, int] | None:
        """(status, error code, completion tokens) its ledger row should have; None: no answer."""
        if self.ended == "done":
            return 200, "", self.tokens
        if self.ended == "event":
            return ERROR_STATUS.get(self.code, 500), self.code, self.tokens
        if self.ended == "cut":
            return 200, "server_lost", self.tokens
        if self.ended == "http":
            return self.status, self.code, 0
        return None


STREAMING: set[int] = set()  # requests whose tokens are flowing now: the kills wait for some (a kill mid-stream)


async def one_request(http: httpx.AsyncClient, url: str, key: str, body: dict) -> Seen:
    seen = Seen()
    try:
        return await _read(http, url, key, body, seen)
    finally:
        STREAMING.discard(id(seen))


async def _read(http: httpx.AsyncClient, url: str, key: str, body: dict, seen: Seen) -> Seen:
    try:
        async with http.stream("POST", url, json=body, headers={"Authorization": f"Bearer {key}"}) as response:
            seen.status = response.status_code
            if response.status_code != 200:
                seen.ended = "http"
                try:
                    seen.code = json.loads(await response.aread())["error"]["code"] or ""
                except (ValueError, KeyError, TypeError):
                    seen.code = "unshaped"
                return seen
            seen.ended = "cut"
            async for line in response.aiter_lines():
                if line == "data: [DONE]":
                    seen.ended = "done" if seen.ended == "cut" else seen.ended
                elif line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        seen.ended, seen.code = "event", chunk["error"]["code"]
                        continue
                    seen.request_id = seen.request_id or chunk["id"]
                    seen.tokens += sum(len(choice.get("token_ids") or ()) for choice in chunk["choices"])
                    STREAMING.add(id(seen))
    except httpx.HTTPError:
        if seen.status is None:
            seen.ended = "none"
    return seen


async def clients(deployment: Deployment, model: str, concurrency: int, seconds: float, max_tokens: int) -> list[Seen]:
    url, key = f"{deployment.base_url}/v1/completions", deployment.headers["Authorization"].split()[1]

    async def one(http: httpx.AsyncClient, index: int) -> Seen:
        body = {"model": model, "prompt": f"Story {index}:", "max_tokens": max_tokens, "ignore_eos": True,
                "stream": True, "return_token_ids": True}
        return await one_request(http, url, key, body)

    return await keep_sending(concurrency, seconds, one, lambda outcome: outcome.ended == "done")


async def faults(deployment: Deployment, seconds: float, log: list) -> None:
    step = seconds / 6
    started = time.monotonic()

    def note(what: str) -> None:
        log.append({"at_s": round(time.monotonic() - started, 1), "fault": what,
                    "streams_under_way": len(STREAMING)})

    async def mid_stream(within: float = 5.0) -> None:
        deadline = time.monotonic() + within
        while not STREAMING and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    await asyncio.sleep(step)
    pids = await asyncio.to_thread(deployment.pids)
    await mid_stream()
    os.kill(pids["worker:worker-0"], signal.SIGKILL)
    note("kill -9 worker-0")
    await asyncio.sleep(step)
    deployment.redis.stop()
    note("redis-server stopped")
    await asyncio.sleep(3)
    deployment.redis.start()
    note("redis-server started")
    await asyncio.sleep(step - 3)
    await asyncio.to_thread(deployment.postgres.stop_server)
    note("postgresql stopped")
    await asyncio.sleep(3)
    await asyncio.to_thread(deployment.postgres.start_server)
    note("postgresql started")
    await asyncio.sleep(step - 3)
    pids = await asyncio.to_thread(deployment.pids)
    await mid_stream()
    os.kill(pids["web"], signal.SIGKILL)
    note("kill -9 web (supervisord starts it again)")


def ledger(deployment: Deployment, since_id: int, settle: float = 90.0) -> list[dict]:
    """The drill's rows once no more arrive for a while (replays run every second here)."""
    import psycopg
    from psycopg.rows import dict_row

    def read() -> list[dict]:
        with psycopg.connect(deployment.postgres.url, row_factory=dict_row) as db:
            return list(db.execute("select id, request_id, status_code, error_code, completion_tokens, key_id "
                                   "from teams_usagerecord where id > %s order by id", (since_id,)))

    deadline, rows, stable_since = time.monotonic() + settle, [], time.monotonic()
    while time.monotonic() < deadline:
        fresh = read()
        if len(fresh) != len(rows):
            rows, stable_since = fresh, time.monotonic()
        elif time.monotonic() - stable_since > 8:
            break
        time.sleep(1)
    return rows


def last_row_id(deployment: Deployment) -> int:
    import psycopg

    with psycopg.connect(deployment.postgres.url) as db:
        return db.execute("select coalesce(max(id), 0) from teams_usagerecord").fetchone()[0]


def reconcile(seen: list[Seen], rows: list[dict]) -> dict:
    """Match each answered request to its row (by id when its client knew it, else by status and code)."""
    by_id = {row["request_id"].split("~")[0]: row for row in rows}
    matched, right, wrong = set(), 0, []
    unnamed: Counter = Counter()
    for outcome in seen:
        expected = outcome.expected()
        if expected is None:
            continue
        if outcome.request_id and outcome.request_id in by_id:
            row = by_id[outcome.request_id]
            matched.add(row["id"])
            got = (row["status_code"], row["error_code"], row["completion_tokens"])
            if got == expected:
                right += 1
            else:
                wrong.append({"request": outcome.request_id, "client_saw": expected, "ledger": got})
        else:
            unnamed[expected] += 1
    spare = Counter((row["status_code"], row["error_code"], row["completion_tokens"])
                    for row in rows if row["id"] not in matched)
    for expected, count in unnamed.items():
        found = min(count, spare[expected])
        right += found
        spare[expected] -= found
        if found < count:
            wrong.append({"client_saw": expected, "requests": count, "rows": found})
    no_answer = sum(outcome.ended == "none" for outcome in seen)
    lost_rows = sum(count for (status, code, _), count in spare.items() if (status, code) == (502, "server_lost"))
    extra = sum(spare.values()) - lost_rows
    sent = len(seen) - no_answer
    return {"requests_sent": sent, "ledger_rows": len(rows) - lost_rows, "rows_with_the_status_and_tokens_seen": right,
            "all_equal": sent == len(rows) - lost_rows == right, "rows_not_matching_any_request": extra,
            "mismatches": wrong[:20], "no_answer_web_down": no_answer,
            "rows_for_them_502_server_lost": lost_rows, "unattributed_rows": sum(row["key_id"] is None for row in rows)}


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    cache = prepare_cache()
    ensure_model(args.model, args.size, cache)
    work = Path(tempfile.mkdtemp(prefix="bench-faults-"))
    deployment = Deployment(cache, work, INFERENCE_LEDGER_REPLAY_SECONDS="1", INFERENCE_WORKER_ACK_TIMEOUT="10")
    fault_log: list = []
    try:
        warm_up(deployment, args.model)
        time.sleep(2)
        since = last_row_id(deployment)

        async def run() -> list[Seen]:
            seen, _ = await asyncio.gather(clients(deployment, args.model, args.concurrency, args.seconds,
                                                   args.max_tokens), faults(deployment, args.seconds, fault_log))
            return seen

        seen = asyncio.run(run())
        rows = ledger(deployment, since)
    finally:
        deployment.stop()
    outcomes = Counter(f"{o.ended} {o.code}".strip() for o in seen)
    report = {"concurrency": args.concurrency, "seconds": args.seconds, "faults": fault_log,
              "outcomes": dict(outcomes.most_common()), **reconcile(seen, rows)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "faults.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    print(f"requests sent {report['requests_sent']} vs ledger rows {report['ledger_rows']} vs rows with the right "
          f"status {report['rows_with_the_status_and_tokens_seen']}: {'all equal' if report['all_equal'] else 'NOT equal'}")
