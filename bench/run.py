"""`python -m bench.run`: raw engine vs. our full stack vs. `transformers serve --continuous-batching`.

One run, one model, one workload (16 prompts, greedy, N new tokens, EOS ignored
where the server allows it); writes bench/results/results.{md,json} and plot.png.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
from pathlib import Path

from .load import bench_prompts, run_load
from .raw import measure_raw
from .report import markdown, plot
from .servers import OurServer, PeerServer, ScaleOut, rss_mb

ROOT = Path(__file__).resolve().parent.parent


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="local/small-llama")
    parser.add_argument("--size", default="small", choices=["tiny", "small"], help="size to build if the model is missing")
    parser.add_argument("--concurrency", default="1,4,16,32")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--memory-runs", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure; the median is reported")
    parser.add_argument("--skip-peer", action="store_true")
    parser.add_argument("--scale-out", action="store_true", help="also run against 2 workers over a private redis-server")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    return parser.parse_args()


def ensure_model(model: str, size: str, cache: Path) -> None:
    from huggingface_hub import scan_cache_dir

    if cache.is_dir() and any(repo.repo_id == model for repo in scan_cache_dir(cache).repos):
        return
    from workers.tiny_models import build_tiny_model

    print(f"building {model} ({size}) into {cache}")
    build_tiny_model(model, size=size, cache_dir=cache)


def sweep(base_url: str, model: str, levels: list[int], max_tokens: int, extra: dict | None,
          repeats: int = 1) -> list[dict]:
    """Per concurrency level, the run of median throughput among `repeats` (errors of all runs count)."""
    asyncio.run(run_load(base_url, model, bench_prompts(4), 4, 8, extra))  # warm-up: loads the model
    rows = []
    for concurrency in levels:
        summaries = []
        for _ in range(repeats):
            result = asyncio.run(run_load(base_url, model, bench_prompts(max(concurrency, 2)), concurrency,
                                          max_tokens, extra))
            summaries.append(result.summary())
            errors = [r.error for r in result.results if r.error]
            if errors:
                print(f"  first error: {errors[0]}")
        row = sorted(summaries, key=lambda s: s["tokens_per_s"])[len(summaries) // 2]
        rows.append({**row, "errors": sum(s["errors"] for s in summaries),
                     "runs_tokens_per_s": [s["tokens_per_s"] for s in summaries]})
        print(f"  c={concurrency}: {rows[-1]}", flush=True)
    return rows


def memory_runs(server: OurServer, model: str, runs: int) -> list[float]:
    after = []
    for _ in range(runs):
        asyncio.run(run_load(server.base_url, model, bench_prompts(16), 16, 32, {"ignore_eos": True}))
        after.append(rss_mb(server.pid))
    return after


def param_count(model: str) -> float:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model, local_files_only=True)
    hidden, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    kv = hidden * config.num_key_value_heads // config.num_attention_heads
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * config.intermediate_size
    return round((layers * per_layer + 2 * vocab * hidden) / 1e6, 1)


def main() -> None:
    args = parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    from huggingface_hub import constants

    cache = Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE)
    os.environ["HF_HUB_CACHE"] = str(cache)
    ensure_model(args.model, args.size, cache)
    levels = [int(c) for c in args.concurrency.split(",")]
    prompts = bench_prompts(16)
    results: dict = {"model": args.model, "params_m": param_count(args.model), "max_tokens": args.max_tokens,
                     "machine": f"{platform.machine()}, {os.cpu_count()} CPUs"}
    print("raw engine…", flush=True)
    results["raw"] = measure_raw(args.model, prompts, args.max_tokens, args.repeats)
    print(f"  {results['raw']}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench-"))

    print("ours…", flush=True)
    ours = OurServer(cache, work / "ours")
    try:
        idle = rss_mb(ours.pid)
        results["ours"] = sweep(ours.base_url, args.model, levels, args.max_tokens, {"ignore_eos": True}, args.repeats)
        runs = memory_runs(ours, args.model, args.memory_runs)
        results["memory"] = {"idle_mb": idle, "after_runs_mb": runs, "growth_mb": round(runs[-1] - runs[0], 1)}
    finally:
        ours.stop()
    single = next((row for row in results["ours"] if row["concurrency"] == 1), None)
    if single and single["ttft_p50_ms"] is not None:
        results["ttft_overhead_ms"] = round(single["ttft_p50_ms"] - results["raw"]["prefill_ms_p50"], 1)

    if not args.skip_peer:
        print("transformers serve --continuous-batching…", flush=True)
        peer = PeerServer(cache, work / "peer", args.model)
        try:
            results["peer"] = sweep(peer.base_url, args.model, levels, args.max_tokens, None, args.repeats)
        finally:
            peer.stop()

    if args.scale_out:
        print("scale-out: 2 workers over Redis…", flush=True)
        scale = ScaleOut(cache, work / "scale")
        try:
            results["scale_out"] = sweep(scale.base_url, args.model, [16], args.max_tokens, {"ignore_eos": True}, args.repeats)
        finally:
            scale.stop()

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    (args.out / "results.md").write_text(markdown(results))
    plot(results, args.out / "plot.png")
    print(markdown(results))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
