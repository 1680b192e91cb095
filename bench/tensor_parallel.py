"""`python -m bench.run --scenario tensor_parallel`: a model split over 2 ranks against the same model on one.

The embedded server with small-llama (or `--model`), greedy through the openai SDK, first on one rank, then
with `INFERENCE_TENSOR_PARALLEL_SIZE=2` (gloo on CPU, NCCL where there is CUDA): 1 stream, then `--streams`
streams at once. Prints tok/s, whether both gave the same tokens, and what the per-step op message costs:
rank 0's sending time per message (/metrics) and a follower's time from a message's arrival to its forward
(its log line at stop), each against the mean engine step. Two ranks on 2 CPU cores is not a speed test:
the figures that matter there are the message's share of a step and the equality.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import tempfile
import time
from pathlib import Path

import httpx

from .models import ensure_model, prepare_cache
from .servers import OurServer

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):", "In the beginning there was"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run --scenario tensor_parallel", description=__doc__)
    parser.add_argument("--model", default="local/small-llama")
    parser.add_argument("--size", type=int, default=2, help="ranks of the split server")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="4 streams of 16 tokens")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.streams, args.tokens = 4, 16
    return args


def generate(base_url: str, model: str, streams: int, tokens: int) -> tuple[list[list[int]], float]:
    """`streams` greedy completions at once: their token ids and the wall time."""
    from openai import AsyncOpenAI

    async def run():
        async with AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=600) as client:
            replies = await asyncio.gather(*(client.completions.create(
                model=model, prompt=PROMPTS[i % len(PROMPTS)] + f" {i}", max_tokens=tokens, temperature=0,
                extra_body={"ignore_eos": True, "return_token_ids": True}) for i in range(streams)))
        return [reply.choices[0].model_extra["token_ids"] for reply in replies]

    started = time.perf_counter()
    ids = asyncio.run(run())
    return ids, time.perf_counter() - started


def metric_sums(base_url: str) -> dict[str, float]:
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=30).text
    sums: dict[str, float] = {}
    for name in ("inference_step_seconds_sum", "inference_step_seconds_count", "inference_tensor_parallel_messages_total",
                 "inference_tensor_parallel_send_seconds_total"):
        sums[name] = sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))
    return sums


def serve_round(cache: Path, args: argparse.Namespace, size: int) -> dict:
    env = {"INFERENCE_TENSOR_PARALLEL_SIZE": str(size)} if size > 1 else {}
    server = OurServer(cache, Path(tempfile.mkdtemp(prefix="bench-tp-")), dtype="float32", **env)
    try:
        generate(server.base_url, args.model, 1, 4)  # loads the model (and its ranks)
        one, one_s = generate(server.base_url, args.model, 1, args.tokens)
        before = metric_sums(server.base_url)
        many, many_s = generate(server.base_url, args.model, args.streams, args.tokens)
        after = metric_sums(server.base_url)
        # unloaded before the stop: the followers log their figures as rank 0 stops them
        httpx.post(server.base_url.removesuffix("/v1") + "/unload_model", json={"model": args.model}, timeout=60)
        time.sleep(1)
    finally:
        server.stop()
    delta = {k: after[k] - before[k] for k in after}
    steps = delta["inference_step_seconds_count"] or 1
    result = {"ranks": size, "one_stream_tok_s": round(len(one[0]) / one_s, 1),
              "streams_tok_s": round(sum(map(len, many)) / many_s, 1), "ids": one + many,
              "step_ms": round(1000 * delta["inference_step_seconds_sum"] / steps, 3)}
    messages = delta["inference_tensor_parallel_messages_total"]
    if messages:
        result["send_us_per_message"] = round(1e6 * delta["inference_tensor_parallel_send_seconds_total"] / messages, 1)
        found = re.findall(r"stopping after (\d+) messages, (\d+) us each", server.server.log())
        if found:
            result["follower_us_per_message"] = float(found[-1][1])
        result["message_share_of_step"] = round(
            (result["send_us_per_message"] + result.get("follower_us_per_message", 0)) / 1000 / result["step_ms"], 3)
    return result


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    cache = prepare_cache()
    if args.model in ("local/small-llama", "local/tiny-llama"):
        ensure_model(args.model, args.model.removeprefix("local/").split("-")[0], cache)
    single = serve_round(cache, args, 1)
    split = serve_round(cache, args, args.size)
    report = {"model": args.model, "streams": args.streams, "tokens": args.tokens,
              "same_tokens": single.pop("ids") == split.pop("ids"), "one_rank": single, f"{args.size}_ranks": split,
              "split_over_single": {"one_stream": round(split["one_stream_tok_s"] / single["one_stream_tok_s"], 2),
                                    "streams": round(split["streams_tok_s"] / single["streams_tok_s"], 2)}}
    print(json.dumps(report, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"tensor_parallel-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(report, indent=2))
