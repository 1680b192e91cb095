"""`python -m bench.run --scenario quantized`: a model quantized on load (torchao int8 weight-only) vs unquantized.

The same model served by a fresh server per run, once as it is and once with `INFERENCE_QUANTIZATION=torchao-int8`
(`serve --quantization`), in interleaved rounds: the server's RSS once the model is loaded and has answered (and
its anonymous and file-backed parts: the checkpoint's memory map counts in the latter), the weights' bytes the
worker reports (`/v1/models` `memory_bytes`), and tokens/s of `--streams` concurrent streams of `--max-tokens`
(EOS ignored). Ratios (quantized / unquantized) are the medians of per-round ratios. On CPU int8 weight-only
mostly saves memory; forgather measured its int4 recipe 6x slower than bf16 at batch 1 on a GPU: measure yours.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path

import httpx

from .load import run_load
from .memory import prompts
from .models import ensure_model, prepare_cache
from .servers import OurServer, rss_mb

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = {"unquantized": {}, "torchao-int8": {"INFERENCE_QUANTIZATION": "torchao-int8"}}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run --scenario quantized", description=__doc__)
    parser.add_argument("--model", default="local/small-llama")
    parser.add_argument("--size", default="small")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny model, 4 streams of 16 tokens, 1 round")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.size, args.streams, args.prompt_tokens, args.max_tokens, args.rounds = \
            "local/tiny-llama", "tiny", 4, 32, 16, 1
    return args


def one_run(cache: Path, work: Path, model: str, texts: list[str], max_tokens: int, env: dict[str, str]) -> dict:
    server = OurServer(cache, work, **env)
    try:
        asyncio.run(run_load(server.base_url, model, texts[:1], 1, 2, {"ignore_eos": True}))  # loads the model
        loaded, anon, files = (rss_mb(server.pid, field) for field in ("VmRSS", "RssAnon", "RssFile"))
        listed = httpx.get(f"{server.base_url}/models", timeout=60).json()["data"]
        memory = next(m["memory_bytes"] for m in listed if m["id"] == model)
        result = asyncio.run(run_load(server.base_url, model, texts, len(texts), max_tokens, {"ignore_eos": True}))
    finally:
        server.stop()
    summary = result.summary()
    return {"tokens_per_s": summary["tokens_per_s"], "errors": summary["errors"], "rss_loaded_mb": loaded,
            "rss_anon_mb": anon, "rss_file_mb": files, "weights_mb": round(memory / 2**20, 1)}


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    cache = prepare_cache()
    ensure_model(args.model, args.size, cache)
    texts = prompts(args.model, args.streams, args.prompt_tokens)
    work = Path(tempfile.mkdtemp(prefix="bench-quantized-"))
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    for index in range(args.rounds):
        for name, env in VARIANTS.items():
            runs[name].append(one_run(cache, work / f"{name}-{index}", args.model, texts, args.max_tokens, env))
            print(f"round {index + 1} {name}: {runs[name][-1]}", flush=True)
    results: dict = {"scenario": "quantized", "model": args.model, "streams": args.streams,
                     "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens, "runs": runs,
                     "quantized_over_unquantized": {
                         key: round(statistics.median(q[key] / u[key] for q, u in zip(runs["torchao-int8"],
                                                                                       runs["unquantized"]) if u[key]), 2)
                         for key in ("tokens_per_s", "rss_loaded_mb", "rss_anon_mb", "weights_mb")}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "quantized.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results["quantized_over_unquantized"]))
    print(f"written to {args.out / 'quantized.json'}")
