"""`python -m bench.run --scenario fairness`: teams sharing one box, in one run against one server.

Four phases on one server with three teams (equal shares) and their keys:
1. alone: team B sends one short request every `--b-every` seconds on an idle box (its TTFT and ITL alone);
   B's client runs in a process of its own in every phase (another user's, not the floods' event loop),
   and B's mean TTFT as the engine sees it (arrival to first token) is reported beside the client's;
2. flood: teams A and C each flood (`--flood` streams x `--flood-tokens`, greedy, EOS ignored) while B
   keeps sending: B's TTFT/ITL beside the flood, and A's and C's shares of the tokens generated while
   both flooded (from the engine's per-team counters, /metrics);
3. batch: a Batch API batch of `--batch-lines` completions runs while B keeps sending: B's ITL with
   batch work running (interactive work goes first);
4. batch idle vs direct: the same lines as a batch on the idle box, and sent directly (as many at once as
   the batch runner runs): the batch's throughput against the direct one.
Every figure is reported against its baseline from the same run.
"""
from __future__ import annotations

import argparse
import asyncio
import io
import json
import multiprocessing
import re
import tempfile
import time
from pathlib import Path

import httpx
from openai import AsyncOpenAI, OpenAI

from tests.live_server import LiveServer, base_env
from tests.teams_setup import make_teams

from .load import RequestResult, bench_prompts, stream_one
from .models import ensure_model, prepare_cache

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run --scenario fairness", description=__doc__)
    parser.add_argument("--model", default="local/tiny-llama")
    parser.add_argument("--size", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--flood", type=int, default=96, help="streams of each flooding team")
    parser.add_argument("--flood-tokens", type=int, default=256)
    parser.add_argument("--b-tokens", type=int, default=32)
    parser.add_argument("--b-every", type=float, default=1.0, help="seconds between team B's requests")
    parser.add_argument("--b-alone", type=int, default=8, help="B's requests on the idle box")
    parser.add_argument("--batch-lines", type=int, default=500)
    parser.add_argument("--batch-tokens", type=int, default=32)
    parser.add_argument("--batch-concurrency", type=int, default=8)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                        help="the server's environment (an A/B of a setting in the same scenario)")
    parser.add_argument("--quick", action="store_true", help="a short run that checks it works")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.flood, args.flood_tokens, args.b_alone, args.batch_lines, args.b_every = 6, 16, 2, 6, 0.5
    return args


def team_tokens(base_url: str) -> dict[str, float]:
    text = httpx.get(base_url + "/metrics", timeout=30).text
    return {m.group(1): float(m.group(2)) for m in
            re.finditer(r'^inference_team_generation_tokens_total\{team="([^"]*)"\} ([0-9.e+]+)$', text, re.M)}


def team_ttft(base_url: str, team: str = "b") -> tuple[float, float]:
    """The engine's time-to-first-token histogram of `team` (arrival at the engine to first token): sum, count."""
    text = httpx.get(base_url + "/metrics", timeout=30).text
    found = [float(re.search(rf'^inference_team_time_to_first_token_seconds_{part}\{{team="{team}"\}} ([0-9.e+-]+)$',
                             text, re.M).group(1)) for part in ("sum", "count")]
    return found[0], found[1]


def ttft_between(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    """The mean engine-side TTFT in ms of the requests between two `team_ttft` readings."""
    count = after[1] - before[1]
    return round(1000 * (after[0] - before[0]) / count, 1) if count else None


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def summary(results: list[RequestResult]) -> dict:
    ttfts = [r.ttft for r in results if r.ttft is not None]
    itls = [gap for r in results for gap in r.itls]
    ms = lambda v: None if v is None else round(v * 1000, 1)  # noqa: E731
    return {"requests": len(results), "errors": sum(1 for r in results if r.error),
            "ttft_p50_ms": ms(percentile(ttfts, 0.5)), "ttft_p95_ms": ms(percentile(ttfts, 0.95)),
            "itl_p50_ms": ms(percentile(itls, 0.5)), "itl_p99_ms": ms(percentile(itls, 0.99))}


async def b_stream(client: AsyncOpenAI, args, stop: asyncio.Event | None, count: int | None) -> list[RequestResult]:
    """Team B: one short request every `b_every` seconds, until `stop` (or `count` requests)."""
    results, sent = [], 0
    while (stop is None or not stop.is_set() or not sent) and (count is None or sent < count):  # one at least
        began = time.monotonic()
        results.append(await stream_one(client, args.model, f"B asks question {sent}:", args.b_tokens,
                                        {"ignore_eos": True, "return_token_ids": True}))
        sent += 1
        await asyncio.sleep(max(0.0, args.b_every - (time.monotonic() - began)))
    return results


def _b_in_process(base_url: str, key: str, args: argparse.Namespace, ready, stop, count: int | None, out) -> None:
    async def run() -> list[RequestResult]:
        client = AsyncOpenAI(base_url=base_url + "/v1", api_key=key, max_retries=0, timeout=600)
        ready.set()
        try:
            return await b_stream(client, args, stop, count)
        finally:
            await client.close()
    out.put(asyncio.run(run()))


class TeamBClient:
    """Team B's requests from a process of its own: B is another user than the flooding teams, so the
    floods' hundreds of streams must not delay B's client in a shared event loop (they did: every
    flood event parsed by the SDK in B's loop added to B's measured TTFT)."""

    def __init__(self, base_url: str, key: str, args: argparse.Namespace, count: int | None = None) -> None:
        context = multiprocessing.get_context("spawn")
        self.ready, self.stop, self.out = context.Event(), context.Event(), context.Queue()
        self.process = context.Process(target=_b_in_process, daemon=True,
                                       args=(base_url, key, args, self.ready, self.stop, count, self.out))
        self.process.start()
        if not self.ready.wait(60):
            raise RuntimeError("team B's client process did not start")

    async def results(self, stop: bool = True) -> list[RequestResult]:
        """B's results: once it has sent its count, or (`stop`) after the request under way."""
        if stop:
            self.stop.set()
        results = await asyncio.to_thread(self.out.get)
        self.process.join(30)
        return results


async def flood(client: AsyncOpenAI, args, team: str) -> list[RequestResult]:
    prompts = [f"Team {team} story {i}: once upon a time" for i in range(args.flood)]
    return list(await asyncio.gather(*[stream_one(client, args.model, p, args.flood_tokens, {"ignore_eos": True})
                                       for p in prompts]))


def batch_lines(args) -> bytes:
    lines = [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": args.model, "prompt": prompt, "max_tokens": args.batch_tokens, "temperature": 0,
                       "ignore_eos": True}}
             for i, prompt in enumerate(bench_prompts(args.batch_lines))]
    return "\n".join(json.dumps(line) for line in lines).encode()


def run_batch(client: OpenAI, args) -> float:
    """Seconds from creating the batch to its completion."""
    upload = client.files.create(file=("lines.jsonl", io.BytesIO(batch_lines(args))), purpose="batch")
    started = time.monotonic()
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    if batch.status != "completed" or batch.request_counts.failed:
        raise RuntimeError(f"batch ended {batch.status}: {batch.request_counts}")
    return time.monotonic() - started


async def direct(client: AsyncOpenAI, args) -> float:
    gate = asyncio.Semaphore(args.batch_concurrency)

    async def one(prompt: str) -> None:
        async with gate:
            await client.completions.create(model=args.model, prompt=prompt, max_tokens=args.batch_tokens,
                                            temperature=0, extra_body={"ignore_eos": True})

    started = time.monotonic()
    await asyncio.gather(*[one(p) for p in bench_prompts(args.batch_lines)])
    return time.monotonic() - started


async def phases(args, base_url: str, keys: dict[str, str]) -> dict:
    clients = {team: AsyncOpenAI(base_url=base_url + "/v1", api_key=key, max_retries=0, timeout=600)
               for team, key in keys.items()}
    sync_b = OpenAI(base_url=base_url + "/v1", api_key=keys["b"], max_retries=0, timeout=600)
    report: dict = {}
    await b_stream(clients["b"], args, None, 2)  # loads the model
    engine_ttft = {}
    ttft_before = await asyncio.to_thread(team_ttft, base_url)
    report["b_alone"] = summary(await TeamBClient(base_url, keys["b"], args, args.b_alone).results(stop=False))
    engine_ttft["alone"] = ttft_between(ttft_before, await asyncio.to_thread(team_ttft, base_url))
    print("B alone:", report["b_alone"], flush=True)

    ttft_before = await asyncio.to_thread(team_ttft, base_url)
    b_task = TeamBClient(base_url, keys["b"], args)
    floods = asyncio.gather(flood(clients["a"], args, "a"), flood(clients["c"], args, "c"))
    if not args.quick:
        await asyncio.sleep(2.0)  # both teams' streams running and queued: their shares count from here
    before, began = await asyncio.to_thread(team_tokens, base_url), time.monotonic()
    if args.quick:  # a short run's floods end within a second or two: their shares over the whole of them
        await floods
    else:
        await asyncio.sleep(min(60.0, max(5.0, args.flood * args.flood_tokens / 2000)))
    after, window = await asyncio.to_thread(team_tokens, base_url), time.monotonic() - began
    await floods
    report["b_beside_flood"] = summary(await b_task.results())
    engine_ttft["beside_flood"] = ttft_between(ttft_before, await asyncio.to_thread(team_ttft, base_url))
    report["b_engine_ttft_mean_ms"] = engine_ttft
    served = {team: after.get(team, 0) - before.get(team, 0) for team in ("a", "c")}
    total = sum(served.values()) or 1
    report["flood_shares"] = {team: round(tokens / total, 3) for team, tokens in served.items()}
    report["flood_window_s"] = round(window, 1)
    print("B beside the flood:", report["b_beside_flood"], "A/C shares:", report["flood_shares"], flush=True)

    b_task = TeamBClient(base_url, keys["b"], args)
    batch_busy = await asyncio.to_thread(run_batch, sync_b, args)
    report["b_beside_batch"] = summary(await b_task.results())
    batch_idle = await asyncio.to_thread(run_batch, sync_b, args)
    direct_s = await direct(clients["b"], args)
    report["batch_seconds"] = {"beside_b": round(batch_busy, 2), "idle": round(batch_idle, 2),
                               "direct": round(direct_s, 2)}
    for client in clients.values():
        await client.close()
    return report


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    cache = prepare_cache()
    ensure_model(args.model, args.size, cache)
    work = Path(tempfile.mkdtemp(prefix="bench-fairness-"))
    env = base_env(cache, work, INFERENCE_MAX_NUM_SEQS=str(args.max_num_seqs),
                   INFERENCE_BATCH_CONCURRENCY=str(args.batch_concurrency), INFERENCE_WORKER_ACK_TIMEOUT="120",
                   **dict(item.split("=", 1) for item in args.server_env))
    server = LiveServer(env, work, name="fairness")
    keys = make_teams(env, {"a": [], "b": [], "c": []}, {"a": ["--team", "a"], "b": ["--team", "b"], "c": ["--team", "c"]})
    report: dict = {"scenario": "fairness", "model": args.model, "flood": args.flood, "flood_tokens": args.flood_tokens,
                    "max_num_seqs": args.max_num_seqs, "batch_lines": args.batch_lines,
                    "server_env": args.server_env}
    try:
        report.update(asyncio.run(phases(args, server.base_url, keys)))
    finally:
        server.stop()
    a, f, bb, seconds = report["b_alone"], report["b_beside_flood"], report["b_beside_batch"], report["batch_seconds"]
    report["ratios"] = {
        "b_ttft_p50_flood_vs_alone": round(f["ttft_p50_ms"] / a["ttft_p50_ms"], 2),
        "b_itl_p99_flood_vs_alone": round(f["itl_p99_ms"] / a["itl_p99_ms"], 2),
        "b_itl_p99_batch_vs_alone": round(bb["itl_p99_ms"] / a["itl_p99_ms"], 2),
        "batch_idle_throughput_vs_direct": round(seconds["direct"] / seconds["idle"], 3),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fairness.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
