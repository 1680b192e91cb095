"""`python -m bench.run --scenario scoring`: a long prompt scored (echo + logprobs, max_tokens 0) vs one forward.

Ours goes through the whole stack (OpenAI SDK, HTTP, channel layer, chunked
prefill, prompt logprobs and text offsets); the baseline is one forward over
the same token ids in this process, which returns every position's logits.
Interleaved rounds; the ratio is the median of the per-round ratios.
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
    parser = argparse.ArgumentParser(prog="bench.run --scenario scoring", description=__doc__)
    parser.add_argument("--model", default="local/small-llama-4k")
    parser.add_argument("--size", default="small-4k", help="size to build if the model is missing")
    parser.add_argument("--tokens", type=int, default=4096, help="prompt length (at most the model's context)")
    parser.add_argument("--logprobs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="tiny model, 480 tokens, 2 rounds: checks it runs")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.size, args.tokens, args.repeats = "local/tiny-llama", "tiny", 480, 2
    return args


SETTLE_SECONDS = 2.5


class OneForward:
    """The baseline: the model in this process, one forward over the whole prompt."""

    def __init__(self, model: str, ids: list[int]) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(model, local_files_only=True).eval()
        self.input_ids = torch.tensor([ids])
        self.seconds()  # warm-up

    def seconds(self) -> float:
        with self.torch.inference_mode():
            started = time.perf_counter()
            self.model(input_ids=self.input_ids, use_cache=False)
            return time.perf_counter() - started


def score_seconds(client, model: str, ids: list[int], logprobs: int) -> float:
    started = time.perf_counter()
    result = client.completions.create(model=model, prompt=ids, max_tokens=0, echo=True, logprobs=logprobs)
    elapsed = time.perf_counter() - started
    scored = result.choices[0].logprobs
    assert len(scored.tokens) == len(ids) and len(scored.text_offset) == len(ids), "not every prompt token was scored"
    return elapsed


def main(argv: list[str]) -> None:
    from openai import OpenAI

    args = parse_args(argv)
    cache = prepare_cache()
    ensure_model(args.model, args.size, cache)
    ids = prompt_ids(args.model, args.tokens)
    server = OurServer(cache, Path(tempfile.mkdtemp(prefix="bench-scoring-")))
    try:
        client = OpenAI(base_url=server.base_url, api_key="bench", max_retries=0, timeout=600)
        score_seconds(client, args.model, ids[:64], args.logprobs)  # loads the model
        raw = OneForward(args.model, ids)
        rounds = []
        for index in range(args.repeats):
            forward = raw.seconds()
            # The baseline just kept both cores busy from another process, and the server gives up
            # torch threads to such work (workers/engine/cpu_share.py): let it see the quiet machine first.
            time.sleep(SETTLE_SECONDS)
            ours = score_seconds(client, args.model, ids, args.logprobs)
            rounds.append({"forward_s": round(forward, 3), "ours_s": round(ours, 3), "ratio": round(ours / forward, 2)})
            print(f"round {index + 1}/{args.repeats}: {rounds[-1]}", flush=True)
    finally:
        server.stop()
    results = {"scenario": "scoring", "model": args.model, "prompt_tokens": len(ids), "logprobs": args.logprobs,
               "rounds": rounds, "ratio_median": statistics.median(r["ratio"] for r in rounds)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scoring.json").write_text(json.dumps(results, indent=2))
    print(f"{len(ids)}-token prompt scored (echo + logprobs={args.logprobs}, max_tokens 0) through the server: "
          f"{results['ratio_median']} x one forward over it (median of {len(rounds)} interleaved rounds)")
