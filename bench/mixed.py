"""`python -m bench.run --scenario mixed`: Poisson arrivals of mixed-length requests, ours vs the peer.

Requests arrive at `--rate` per second (exponential gaps, as `vllm bench serve`
and guidellm do), prompts of 32–2,048 tokens and outputs of 16–512 drawn
uniformly from a seeded generator, each a streaming completion from the OpenAI
SDK's async client. The same request list goes to ours (once per
`--prefill-chunks` × `--prefill-shares` value, a fresh server each) and to `transformers serve
--continuous-batching`; raw `generate` applies only as `--raw`: the same requests
one after another in-process (no arrivals, no batching), for throughput alone.
Reports throughput (output tokens / wall), TTFT and inter-token latency p50/p99 (per token, as
`bench/load.py` counts it).
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import tempfile
import time
from pathlib import Path

from openai import AsyncOpenAI

from .load import LoadResult, RequestResult, stream_one
from .models import ensure_model, prepare_cache, prompt_ids
from .servers import OurServer, PeerServer

ROOT = Path(__file__).resolve().parent.parent
# return_token_ids (as vLLM): a chunk for every token, so inter-token latency is per token.
# The peer is sent no extra fields (it refuses keys it does not know).
OURS_EXTRA = {"ignore_eos": True, "return_token_ids": True}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run --scenario mixed", description=__doc__)
    parser.add_argument("--model", default="local/small-llama-4k", help="needs a context of prompt + output")
    parser.add_argument("--size", default="small-4k")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--rate", type=float, default=0.5, help="requests per second (Poisson arrivals)")
    parser.add_argument("--prompt-tokens", default="32,2048", help="min,max prompt length")
    parser.add_argument("--output-tokens", default="16,512", help="min,max output length")
    parser.add_argument("--prefill-chunks", default="", help="INFERENCE_PREFILL_CHUNK values to run ours with, e.g. 128,512")
    parser.add_argument("--prefill-shares", default="", help="INFERENCE_PREFILL_SHARE values to run ours with, e.g. 0.5,1.0")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-peer", action="store_true")
    parser.add_argument("--raw", action="store_true", help="also the same requests one by one with model.generate")
    parser.add_argument("--quick", action="store_true", help="tiny model, 10 short requests, no peer: checks it runs")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.size, args.requests, args.rate = "local/tiny-llama", "tiny", 10, 4.0
        args.prompt_tokens, args.output_tokens, args.skip_peer = "32,400", "16,64", True
    return args


def workload(args: argparse.Namespace) -> list[tuple[float, str, int]]:
    """(arrival second, prompt text, max_tokens) per request, the same for every server."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    low_p, high_p = (int(v) for v in args.prompt_tokens.split(","))
    low_o, high_o = (int(v) for v in args.output_tokens.split(","))
    stream = prompt_ids(args.model, high_p * 2)[1:]
    rng = random.Random(args.seed)
    requests, at = [], 0.0
    for _ in range(args.requests):
        length, start = rng.randint(low_p, high_p), rng.randrange(high_p)
        text = tokenizer.decode(stream[start:start + length - 1])  # + BOS: about `length` tokens
        requests.append((round(at, 3), text, rng.randint(low_o, high_o)))
        at += rng.expovariate(args.rate)
    return requests


async def arrivals(base_url: str, model: str, requests: list[tuple[float, str, int]], extra: dict | None) -> LoadResult:
    client = AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=1800)
    started = time.perf_counter()

    async def at_its_time(arrival: float, prompt: str, max_tokens: int) -> RequestResult:
        await asyncio.sleep(max(0.0, started + arrival - time.perf_counter()))
        return await stream_one(client, model, prompt, max_tokens, extra or {})

    results = await asyncio.gather(*[at_its_time(*request) for request in requests])
    wall = time.perf_counter() - started
    await client.close()
    return LoadResult(0, len(requests), wall, list(results))


def summarize(result: LoadResult) -> dict:
    ttfts = [r.ttft for r in result.results if r.ttft is not None]
    itls = [gap for r in result.results for gap in r.itls]
    ms = lambda v: None if v is None else round(v * 1000, 1)  # noqa: E731
    itl_p50, itl_p99 = result.percentile(itls, 0.5), result.percentile(itls, 0.99)
    return {"requests": result.requests, "errors": result.errors, "output_tokens": result.tokens,
            "wall_s": round(result.wall_seconds, 1), "tokens_per_s": round(result.tokens_per_second, 1),
            "ttft_p50_ms": ms(result.percentile(ttfts, 0.5)), "ttft_p99_ms": ms(result.percentile(ttfts, 0.99)),
            "itl_p50_ms": ms(itl_p50), "itl_p99_ms": ms(itl_p99),
            "itl_p99_over_p50": round(itl_p99 / itl_p50, 2) if itl_p50 else None}


def raw_serial(model: str, requests: list[tuple[float, str, int]]) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    lm = AutoModelForCausalLM.from_pretrained(model, local_files_only=True).eval()
    tokens, started = 0, time.perf_counter()
    with torch.inference_mode():
        for _, prompt, max_tokens in requests:
            inputs = tokenizer(prompt, return_tensors="pt")
            lm.generate(**inputs, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False)
            tokens += max_tokens
    wall = time.perf_counter() - started
    return {"output_tokens": tokens, "wall_s": round(wall, 1), "tokens_per_s": round(tokens / wall, 1)}


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    cache = prepare_cache()
    ensure_model(args.model, args.size, cache)
    requests = workload(args)
    work = Path(tempfile.mkdtemp(prefix="bench-mixed-"))
    results: dict = {"scenario": "mixed", "model": args.model, "rate": args.rate, "requests": args.requests,
                     "prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens, "runs": {}}
    chunks = [c for c in args.prefill_chunks.split(",") if c] or [None]
    shares = [s for s in args.prefill_shares.split(",") if s] or [None]
    for chunk, share in itertools.product(chunks, shares):
        settings = {"INFERENCE_PREFILL_CHUNK": chunk, "INFERENCE_PREFILL_SHARE": share}
        settings = {key: value for key, value in settings.items() if value}
        name = "ours" + "".join(f" ({key[10:].lower().replace('_', ' ')} {value})" for key, value in settings.items())
        server = OurServer(cache, work / f"ours-{chunk}-{share}", **settings)
        try:
            asyncio.run(arrivals(server.base_url, args.model, requests[:2], OURS_EXTRA))  # loads it
            results["runs"][name] = summarize(asyncio.run(arrivals(server.base_url, args.model, requests, OURS_EXTRA)))
        finally:
            server.stop()
        print(f"{name}: {results['runs'][name]}", flush=True)
    if not args.skip_peer:
        peer = PeerServer(cache, work / "peer", args.model)
        try:
            asyncio.run(arrivals(peer.base_url, args.model, requests[:2], None))
            results["runs"]["transformers serve --continuous-batching"] = summarize(
                asyncio.run(arrivals(peer.base_url, args.model, requests, None)))
        finally:
            peer.stop()
        print(f"peer: {results['runs']['transformers serve --continuous-batching']}", flush=True)
    if args.raw:
        results["runs"]["raw generate, one by one"] = raw_serial(args.model, requests)
        print(f"raw: {results['runs']['raw generate, one by one']}", flush=True)
    peer_run = results["runs"].get("transformers serve --continuous-batching")
    if peer_run and peer_run["tokens_per_s"]:
        results["ours_over_peer_tokens_per_s"] = {name: round(run["tokens_per_s"] / peer_run["tokens_per_s"], 2)
                                                  for name, run in results["runs"].items() if name.startswith("ours")}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mixed.json").write_text(json.dumps(results, indent=2))
    print(json.dumps({k: v for k, v in results.items() if k != "runs"}))
    print(f"written to {args.out / 'mixed.json'}")
