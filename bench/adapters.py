"""`python -m bench.run --scenario adapters`: streams spread over 8 LoRA adapters of one base vs. the base alone.

Teams' fine-tunes share one base in memory and decode in one batch (peft's mixed-adapter batches).
What that costs: the same `--streams` streaming requests (greedy, fixed `max_tokens`, EOS ignored)
once spread round-robin over `--adapters` adapters of the base, once all on the base, on one server,
in interleaved rounds. Reports each one's tok/s, the ratio adapters/base (median of the per-round
ratios) and the engine's mean step time and batch during each (from its Prometheus histograms: a
batch split by adapter would show as a smaller mean batch). The adapters are built offline into the
cache (`create_tiny_model NAME --arch lora --base MODEL`: random, non-zero LoRA weights).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from openai import AsyncOpenAI

from .load import LoadResult, bench_prompts, stream_one
from .models import ensure_model, prepare_cache
from .overhead import engine_counters, per_step
from .servers import OurServer

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run --scenario adapters", description=__doc__)
    parser.add_argument("--model", default="local/small-llama", help="the base model")
    parser.add_argument("--size", default="small", choices=["tiny", "small"], help="size to build if the base is missing")
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=8, help="the adapters' LoRA rank")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="tiny base, 4 adapters, 8 streams x 8 tokens, one round")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.size, args.adapters, args.streams, args.max_tokens, args.rounds = (
            "local/tiny-llama", "tiny", 4, 8, 8, 1)
    return args


def adapter_names(base: str, count: int, rank: int) -> list[str]:
    return [f"{base}-lora{rank}-{index}" for index in range(count)]


def ensure_adapters(base: str, names: list[str], rank: int, cache: Path) -> None:
    """Build the adapters the cache lacks (each with its own seed, so each answers differently)."""
    from huggingface_hub import scan_cache_dir

    present = {repo.repo_id for repo in scan_cache_dir(cache).repos}
    from workers.tiny.lora import build_tiny_lora

    for seed, name in enumerate(names, 1):
        if name not in present:
            print(f"building {name} (LoRA rank {rank} of {base}) into {cache}", flush=True)
            build_tiny_lora(name, base, cache_dir=cache, seed=seed, rank=rank)


async def spread_load(base_url: str, models: list[str], prompts: list[str], max_tokens: int) -> dict:
    """Every prompt at once as a stream, prompt i on models[i % len(models)]; tok/s over the wall time."""
    client = AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=600)
    started = time.perf_counter()
    results = await asyncio.gather(*[stream_one(client, models[i % len(models)], prompt, max_tokens,
                                                {"ignore_eos": True}) for i, prompt in enumerate(prompts)])
    wall = time.perf_counter() - started
    await client.close()
    summary = LoadResult(len(prompts), len(prompts), wall, list(results)).summary()
    errors = [r.error for r in results if r.error]
    if errors:
        print(f"  first error: {errors[0]}", flush=True)
    return summary


def measured(base_url: str, models: list[str], prompts: list[str], max_tokens: int) -> dict:
    before = engine_counters(base_url)
    summary = asyncio.run(spread_load(base_url, models, prompts, max_tokens))
    return {**summary, **per_step(before, engine_counters(base_url))}


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    cache = prepare_cache()
    ensure_model(args.model, args.size, cache)
    adapters = adapter_names(args.model, args.adapters, args.rank)
    ensure_adapters(args.model, adapters, args.rank, cache)
    prompts = bench_prompts(args.streams)
    server = OurServer(cache, Path(tempfile.mkdtemp(prefix="bench-adapters-")),
                       INFERENCE_MAX_NUM_SEQS=str(max(args.streams, 32)))
    rounds = []
    try:
        asyncio.run(spread_load(server.base_url, [args.model, *adapters], bench_prompts(len(adapters) + 1), 4))  # loads all
        for index in range(args.rounds):
            base = measured(server.base_url, [args.model], prompts, args.max_tokens)
            spread = measured(server.base_url, adapters, prompts, args.max_tokens)
            row = {"base": base, "adapters": spread,
                   "ratio": round(spread["tokens_per_s"] / base["tokens_per_s"], 3) if base["tokens_per_s"] else None}
            rounds.append(row)
            print(f"round {index + 1}/{args.rounds}: base {base['tokens_per_s']} tok/s (batch {base['batch_mean']}, "
                  f"step {base['step_ms_mean']} ms); {len(adapters)} adapters {spread['tokens_per_s']} tok/s "
                  f"(batch {spread['batch_mean']}, step {spread['step_ms_mean']} ms): {row['ratio']}x", flush=True)
    finally:
        server.stop()
    ratios = [r["ratio"] for r in rounds if r["ratio"] is not None]
    summary = {
        "scenario": "adapters", "model": args.model, "adapters": adapters, "rank": args.rank, "streams": args.streams,
        "max_tokens": args.max_tokens, "rounds": rounds,
        "base_tokens_per_s": statistics.median(r["base"]["tokens_per_s"] for r in rounds),
        "adapters_tokens_per_s": statistics.median(r["adapters"]["tokens_per_s"] for r in rounds),
        "ratio_median": statistics.median(ratios) if ratios else None,
        "errors": sum(r["base"]["errors"] + r["adapters"]["errors"] for r in rounds),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "adapters.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k != "rounds"}, indent=2))
