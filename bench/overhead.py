"""`python -m bench.run --scenario overhead`: the engine's host cost per step, where the model costs almost nothing.

The `tiny` model's forward takes a fraction of a millisecond, so what a step costs beyond
raw `model.generate`'s is the server's own Python: sampling, detokenizing, messages. One run:
raw padded `generate` of 64 prompts x 128 tokens, then ours with the same 64 requests at once,
non-streaming and streaming (greedy, EOS ignored), in interleaved rounds. Reports tok/s and each
as a ratio to raw, TTFT p95 of the streaming run, and the engine's own mean step time and batch
(from its Prometheus histograms), and the wall time of the same requests at once asking for one token
each: the cost of admitting them (HTTP, auth, validation, a job each) with almost no decoding, and the
event loop's CPU per request in it. The client's own CPU is reported too: it runs on the same cores
(`--client http`: plain aiohttp, as vLLM's benchmark_serving, instead of the OpenAI SDK).
Works on a GPU too (`--device cuda`).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from openai import AsyncOpenAI

from .load import bench_prompts, http_session, run_load
from .models import ensure_model, prepare_cache
from .raw import RawEngine
from .servers import OurServer, ScaleOut

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run --scenario overhead", description=__doc__)
    parser.add_argument("--model", default="local/tiny-llama")
    parser.add_argument("--size", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="the server's --device (and raw generate's)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--server-root", type=Path, help="run the server of another checkout (a git worktree of an "
                        "earlier commit: the figures before a change, against raw in the same run)")
    parser.add_argument("--scale-out", action="store_true", help="the web process and one `run_worker` over a private "
                        "redis-server instead of the embedded default: what splitting web and engine into two processes "
                        "gives on the same cores (the CPU counted is all three processes')")
    parser.add_argument("--client", default="sdk", choices=["sdk", "http"], help="the requests' client: the OpenAI "
                        "SDK, or plain aiohttp as vLLM's benchmark_serving (the SDK's own CPU, on the same cores, is "
                        "reported either way)")
    parser.add_argument("--quick", action="store_true", help="8 requests x 16 tokens, one round: checks it runs")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.max_tokens, args.rounds = 8, 16, 1
    return args


def engine_counters(base_url: str) -> dict[str, float]:
    """The engine's step and batch histograms' sums and counts (ours exposes them on /metrics)."""
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=30).text
    found = {}
    for name in ("inference_step_seconds_sum", "inference_step_seconds_count", "inference_batch_size_sum",
                 "inference_batch_size_count"):
        match = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
        found[name] = float(match.group(1)) if match else 0.0
    return found


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of a process and every process below it, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    tree, grown = {pid}, True
    while grown:
        below = {child for child, parent in parents.items() if parent in tree} - tree
        grown = bool(below)
        tree |= below
    total = 0.0
    for member in tree:
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def main_thread_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process's main thread: the web process's event loop (Daphne runs it there)."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def per_step(before: dict[str, float], after: dict[str, float]) -> dict:
    steps = after["inference_step_seconds_count"] - before["inference_step_seconds_count"]
    batches = after["inference_batch_size_count"] - before["inference_batch_size_count"]
    return {
        "steps": int(steps),
        "step_ms_mean": round(1000 * (after["inference_step_seconds_sum"] - before["inference_step_seconds_sum"]) / steps, 3)
        if steps else None,
        "batch_mean": round((after["inference_batch_size_sum"] - before["inference_batch_size_sum"]) / batches, 1)
        if batches else None,
    }


async def non_streaming(base_url: str, model: str, prompts: list[str], max_tokens: int, client: str = "sdk",
                        api_key: str = "bench") -> dict:
    """Every request at once, each answered whole; tok/s over the wall time of all of them."""
    started = time.perf_counter()
    if client == "http":
        async with http_session(api_key) as session:
            async def one(prompt: str) -> int:
                async with session.post(base_url.rstrip("/") + "/completions", json={
                        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                        "ignore_eos": True}) as response:
                    return (await response.json())["usage"]["completion_tokens"]
            counts = await asyncio.gather(*[one(p) for p in prompts])
    else:
        sdk = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=600)
        answers = await asyncio.gather(*[
            sdk.completions.create(model=model, prompt=p, max_tokens=max_tokens, temperature=0,
                                   extra_body={"ignore_eos": True}) for p in prompts])
        await sdk.close()
        counts = [a.usage.completion_tokens for a in answers]
    wall = time.perf_counter() - started
    tokens = sum(counts)
    return {"tokens": tokens, "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 1)}


def streaming(base_url: str, model: str, prompts: list[str], max_tokens: int, client: str = "sdk") -> dict:
    result = asyncio.run(run_load(base_url, model, prompts, len(prompts), max_tokens, {"ignore_eos": True},
                                  client=client))
    return result.summary()


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    cache = prepare_cache()
    ensure_model(args.model, args.size, cache)
    prompts = bench_prompts(args.requests)
    raw = RawEngine(args.model, prompts, device=args.device, dtype=args.dtype)
    env = dict(item.split("=", 1) for item in args.server_env)
    env.setdefault("INFERENCE_MAX_NUM_SEQS", str(max(args.requests, 64)))
    work = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    if args.scale_out:
        env.setdefault("INFERENCE_DEVICE", args.device)
        env.setdefault("INFERENCE_DTYPE", args.dtype)
        server = ScaleOut(cache, work / "scale-out", workers=1, **env)
        server.pids = [server.web.process.pid, server.redis.process.pid, *(w.process.pid for w in server.workers)]
    else:
        server = OurServer(cache, work / "ours", root=args.server_root, device=args.device, dtype=args.dtype, **env)
        server.pids = [server.pid]
    rounds = []
    try:
        asyncio.run(non_streaming(server.base_url, args.model, prompts[:4], 8))  # loads the model
        for index in range(args.rounds):
            raw_cpu = time.process_time()
            raw_tps = raw.batch_tokens_per_s(args.max_tokens)
            raw_cpu = time.process_time() - raw_cpu
            before = engine_counters(server.base_url)
            cpu_before, client_before = sum(map(tree_cpu_seconds, server.pids)), time.process_time()
            plain = asyncio.run(non_streaming(server.base_url, args.model, prompts, args.max_tokens, args.client))
            cpu_middle, client_middle = sum(map(tree_cpu_seconds, server.pids)), time.process_time()
            middle = engine_counters(server.base_url)
            streamed = streaming(server.base_url, args.model, prompts, args.max_tokens, args.client)
            cpu_after, client_after = sum(map(tree_cpu_seconds, server.pids)), time.process_time()
            after = engine_counters(server.base_url)
            tokens = args.requests * args.max_tokens
            cpu = {"raw_cpu_ms_per_1k_tokens": round(raw_cpu * 1e6 / tokens, 1),
                   "ours_cpu_ms_per_1k_tokens": round((cpu_middle - cpu_before) * 1e6 / plain["tokens"], 1),
                   "ours_streaming_cpu_ms_per_1k_tokens": round((cpu_after - cpu_middle) * 1e6 / streamed["tokens"], 1)}
            # The client runs on the same cores: its CPU is time the server could not have.
            cpu["client_cpu_ms"] = round(1000 * (client_middle - client_before), 1)
            cpu["streaming_client_cpu_ms"] = round(1000 * (client_after - client_middle), 1)
            cpu["cpu_per_token_vs_raw"] = round(cpu["ours_cpu_ms_per_1k_tokens"] / cpu["raw_cpu_ms_per_1k_tokens"], 2)
            cpu["streaming_cpu_per_token_vs_raw"] = round(
                cpu["ours_streaming_cpu_ms_per_1k_tokens"] / cpu["raw_cpu_ms_per_1k_tokens"], 2)
            loop_before = main_thread_cpu_seconds(server.pids[0])
            admitted = asyncio.run(non_streaming(server.base_url, args.model, prompts, 1, args.client))
            loop_seconds = main_thread_cpu_seconds(server.pids[0]) - loop_before
            loop_ms_per_request = round(1000 * loop_seconds / len(prompts), 2)
            row = {"raw_tokens_per_s": raw_tps, "non_streaming": {**plain, **per_step(before, middle)},
                   "streaming": {**streamed, **per_step(middle, after)},
                   "one_token_burst_ms": round(1000 * admitted["wall_s"], 1),
                   "burst_loop_cpu_ms_per_request": loop_ms_per_request, **cpu}
            row["non_streaming_vs_raw"] = round(plain["tokens_per_s"] / raw_tps, 3)
            row["streaming_vs_raw"] = round(streamed["tokens_per_s"] / raw_tps, 3)
            rounds.append(row)
            print(f"round {index + 1}: raw {raw_tps} tok/s; ours {plain['tokens_per_s']} "
                  f"({row['non_streaming_vs_raw']}x), streaming {streamed['tokens_per_s']} ({row['streaming_vs_raw']}x), "
                  f"TTFT p95 {streamed['ttft_p95_ms']} ms; step {row['non_streaming']['step_ms_mean']} ms "
                  f"at batch {row['non_streaming']['batch_mean']}; "
                  f"{args.requests} one-token requests {row['one_token_burst_ms']} ms "
                  f"(the event loop's CPU {row['burst_loop_cpu_ms_per_request']} ms a request); "
                  f"CPU per token vs raw {cpu['cpu_per_token_vs_raw']}x "
                  f"(streaming {cpu['streaming_cpu_per_token_vs_raw']}x); "
                  f"the client's CPU {cpu['client_cpu_ms']} ms (streaming {cpu['streaming_client_cpu_ms']} ms)",
                  flush=True)
    finally:
        server.stop()
        raw.close()
    summary = {
        "scenario": "overhead", "deployment": "scale-out" if args.scale_out else "embedded", "model": args.model,
        "device": args.device, "requests": args.requests, "client": args.client,
        "max_tokens": args.max_tokens, "rounds": rounds,
        "median": {key: statistics.median(r[key] for r in rounds) for key in (
            "non_streaming_vs_raw", "streaming_vs_raw", "cpu_per_token_vs_raw", "streaming_cpu_per_token_vs_raw")},
        "median_ttft_p95_ms": statistics.median(r["streaming"]["ttft_p95_ms"] or 0 for r in rounds),
        "median_step_ms": statistics.median(r["non_streaming"]["step_ms_mean"] or 0 for r in rounds),
        "median_one_token_burst_ms": statistics.median(r["one_token_burst_ms"] for r in rounds),
        "median_burst_loop_cpu_ms_per_request": statistics.median(r["burst_loop_cpu_ms_per_request"] for r in rounds),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "overhead.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k != "rounds"}, indent=2))
