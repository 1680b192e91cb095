"""`python -m bench.run --scenario contention`: one long-lived server, c1/c16/c1/c16…, beside busy processes.

Busy competitors (plain Python loops, each pinned to one core) run for the whole
scenario, as on a shared box or a CI runner; `--competitors 0` measures the quiet
steady state. Per round and level: raw `model.generate` under the same contention
(one sequence at c1, a padded batch at c16), then ours, and the server's CPU time
(its main, event-loop thread and the whole process) during our run.
Steady-state checks: every c1 run >= 0.9 x the first, every c16 run within 15% of their median.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .load import bench_prompts, run_load
from .models import ensure_model, prepare_cache
from .raw import RawEngine
from .servers import OurServer

ROOT = Path(__file__).resolve().parent.parent
BUSY_LOOP = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run --scenario contention", description=__doc__)
    parser.add_argument("--model", default="local/small-llama")
    parser.add_argument("--size", default="small")
    parser.add_argument("--competitors", type=int, default=1, help="busy processes (0: a quiet steady-state run)")
    parser.add_argument("--competitor-cores", default="", help="cores to pin them to, e.g. 1 or 0,1 (default: the last ones)")
    parser.add_argument("--levels", default="1,16", help="concurrency levels, in order, each round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--torch-threads", type=int, default=None, help="the server's INFERENCE_TORCH_THREADS (default: its own)")
    parser.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                        help="extra environment for the server, e.g. OMP_WAIT_POLICY=PASSIVE (repeatable)")
    parser.add_argument("--quick", action="store_true", help="tiny model, 2 rounds, 16 tokens: checks it runs")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.size, args.rounds, args.max_tokens = "local/tiny-llama", "tiny", 2, 16
    return args


def thread_cpu_seconds(pid: int, tid: int | None = None) -> float:
    """utime + stime of a process (or one of its threads) from /proc."""
    path = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_competitors(count: int, cores: str) -> list[subprocess.Popen]:
    mine = sorted(os.sched_getaffinity(0))
    chosen = [int(c) for c in cores.split(",")] if cores else mine[-count:] if count else []
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(chosen[i % len(chosen)])]) for i in range(count)]


def measure(server: OurServer, model: str, concurrency: int, max_tokens: int) -> dict:
    main_before, all_before = thread_cpu_seconds(server.pid, server.pid), thread_cpu_seconds(server.pid)
    result = asyncio.run(run_load(server.base_url, model, bench_prompts(max(concurrency, 2)), concurrency, max_tokens,
                                  {"ignore_eos": True}))
    main_cpu = thread_cpu_seconds(server.pid, server.pid) - main_before
    summary = result.summary()
    summary.update(main_thread_cpu_s=round(main_cpu, 2), process_cpu_s=round(thread_cpu_seconds(server.pid) - all_before, 2),
                   wall_s=round(result.wall_seconds, 2),
                   main_thread_ms_per_token=round(1000 * main_cpu / max(result.tokens, 1), 3))
    return summary


def raw_tokens_per_s(raw: RawEngine, concurrency: int, max_tokens: int) -> float | None:
    if concurrency == 1:
        return raw.single_tokens_per_s(max_tokens)
    return raw.batch_tokens_per_s(max_tokens) if concurrency == raw.batch_size else None


def steady_checks(runs: dict[int, list[dict]]) -> dict:
    checks = {}
    if 1 in runs:
        first = runs[1][0]["tokens_per_s"]
        checks["c1_min_over_first"] = round(min(r["tokens_per_s"] for r in runs[1]) / first, 2)
    for level in (c for c in runs if c != 1):
        values = [r["tokens_per_s"] for r in runs[level]]
        median = statistics.median(values)
        checks[f"c{level}_max_deviation_from_median"] = round(max(abs(v - median) for v in values) / median, 2)
    return checks


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    cache = prepare_cache()
    ensure_model(args.model, args.size, cache)
    levels = [int(c) for c in args.levels.split(",")]
    env = dict(item.split("=", 1) for item in args.server_env)
    if args.torch_threads is not None:
        env["INFERENCE_TORCH_THREADS"] = str(args.torch_threads)
    work = Path(tempfile.mkdtemp(prefix="bench-contention-"))
    server = OurServer(cache, work, **env)
    competitors: list[subprocess.Popen] = []
    runs: dict[int, list[dict]] = {c: [] for c in levels}
    try:
        asyncio.run(run_load(server.base_url, args.model, bench_prompts(4), 4, 8, {"ignore_eos": True}))  # loads it
        raw = RawEngine(args.model, bench_prompts(16))
        competitors = start_competitors(args.competitors, args.competitor_cores)
        for index in range(args.rounds):
            for concurrency in levels:
                baseline = raw_tokens_per_s(raw, concurrency, args.max_tokens)
                row = measure(server, args.model, concurrency, args.max_tokens)
                row.update(round=index + 1, raw_tokens_per_s=baseline,
                           ours_raw=round(row["tokens_per_s"] / baseline, 2) if baseline else None)
                runs[concurrency].append(row)
                print(f"round {index + 1} c{concurrency}: ours {row['tokens_per_s']} tok/s, raw {baseline}, "
                      f"ours/raw {row['ours_raw']}, main thread {row['main_thread_cpu_s']} s CPU "
                      f"({row['main_thread_ms_per_token']} ms/token), process {row['process_cpu_s']} s, "
                      f"errors {row['errors']}", flush=True)
        raw.close()
    finally:
        for process in competitors:
            process.kill()
            process.wait()
        server.stop()
    results = {"scenario": "contention", "model": args.model, "competitors": args.competitors,
               "cores": len(os.sched_getaffinity(0)), "max_tokens": args.max_tokens, "runs": runs,
               "ours_raw_median": {str(c): statistics.median(r["ours_raw"] for r in rows) for c, rows in runs.items()
                                   if rows and rows[0]["ours_raw"] is not None},
               "steady": steady_checks(runs),
               "thread_changes": [line for line in server.server.log().splitlines() if "torch threads" in line]}
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"contention-{args.competitors}.json"
    (args.out / name).write_text(json.dumps(results, indent=2))
    print(f"ours/raw (median over rounds): {results['ours_raw_median']}; steady state: {results['steady']}")
    print(f"written to {args.out / name}")
