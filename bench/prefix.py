"""`python -m bench.run --scenario prefix`: time to first token with a long shared prefix, a miss vs a hit.

Each round sends a prompt that starts with a new `--prefix-tokens` prefix (a
miss: the whole prompt is prefilled), then another question after the same
prefix (a hit: only the question is prefilled). TTFT of both through the OpenAI
SDK's streaming client; the ratio is the median of per-round miss/hit ratios.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from .models import ensure_model, prepare_cache, prompt_ids
from .servers import OurServer

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run --scenario prefix", description=__doc__)
    parser.add_argument("--model", default="local/small-llama")
    parser.add_argument("--size", default="small")
    parser.add_argument("--prefix-tokens", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="tiny model, 400-token prefix, 2 rounds")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.size, args.prefix_tokens, args.rounds = "local/tiny-llama", "tiny", 400, 2
    return args


def ttft(client, model: str, prompt: str) -> float:
    started = time.perf_counter()
    for chunk in client.completions.create(model=model, prompt=prompt, max_tokens=2, temperature=0, stream=True):
        if chunk.choices and chunk.choices[0].text:
            return time.perf_counter() - started
    return time.perf_counter() - started


def main(argv: list[str]) -> None:
    from openai import OpenAI
    from transformers import AutoTokenizer

    args = parse_args(argv)
    cache = prepare_cache()
    ensure_model(args.model, args.size, cache)
    tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    stream = prompt_ids(args.model, args.prefix_tokens + 40 * args.rounds)[1:]
    server = OurServer(cache, Path(tempfile.mkdtemp(prefix="bench-prefix-")))
    rounds = []
    try:
        client = OpenAI(base_url=server.base_url, api_key="bench", max_retries=0, timeout=600)
        ttft(client, args.model, "warm up")
        for index in range(args.rounds):
            prefix = f"Round {index}. " + tokenizer.decode(stream[40 * index: 40 * index + args.prefix_tokens])
            miss = ttft(client, args.model, prefix + " Question one: what happened next?")
            hit = ttft(client, args.model, prefix + " Question two: who was there?")
            rounds.append({"miss_ms": round(miss * 1000, 1), "hit_ms": round(hit * 1000, 1), "ratio": round(miss / hit, 2)})
            print(f"round {index + 1}/{args.rounds}: {rounds[-1]}", flush=True)
    finally:
        server.stop()
    results = {"scenario": "prefix", "model": args.model, "prefix_tokens": args.prefix_tokens, "rounds": rounds,
               "miss_over_hit_median": statistics.median(r["ratio"] for r in rounds)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefix.json").write_text(json.dumps(results, indent=2))
    print(f"TTFT with a {args.prefix_tokens}-token shared prefix: a hit is {results['miss_over_hit_median']} x "
          f"faster than a miss (median of {len(rounds)} rounds)")
