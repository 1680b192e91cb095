"""`python -m bench.run --scenario memory`: KV cache memory and speed at many long streams, vs another git ref.

`--streams` concurrent streaming requests of `--prompt-tokens` each (distinct
prompts) and `--max-tokens` new tokens, EOS ignored, against a fresh server per
run so its peak RSS (VmHWM) is this load's; the peak above the RSS right after
the model loaded approximates the KV cache and its copies. The same load runs
against the server of `--baseline-ref` (a detached git worktree of that ref,
default `main`) in interleaved rounds; ratios are the medians of per-round ratios.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import tempfile
from pathlib import Path

import httpx

from .load import run_load
from .models import ensure_model, prepare_cache, prompt_ids
from .servers import GitRef, OurServer, rss_mb

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run --scenario memory", description=__doc__)
    parser.add_argument("--model", default="local/small-llama-4k")
    parser.add_argument("--size", default="small-4k")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline-ref", default="main", help="git ref to compare with ('' : none)")
    parser.add_argument("--mixed", action="store_true",
                        help="one 3,500-token prompt beside 31 of 100 tokens (64 new tokens each, no prefix cache, "
                             "a 2 GiB KV budget): the most KV bytes the cache held (its own count, from "
                             "vllm:kv_cache_usage_perc) over the bytes of the tokens the rows hold at most")
    parser.add_argument("--quick", action="store_true", help="tiny model, 8 streams of 300 tokens, 1 round")
    parser.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                        help="extra environment for our server (not the baseline's), e.g. INFERENCE_PREFIX_CACHE_MB=0")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.mixed:
        args.baseline_ref, args.max_tokens = "", 64
        args.server_env += ["INFERENCE_PREFIX_CACHE_MB=0", f"INFERENCE_KV_CACHE_MEMORY={MIXED_BUDGET}"]
    if args.quick:
        args.model, args.size, args.streams, args.prompt_tokens, args.max_tokens, args.rounds = \
            "local/tiny-llama", "tiny", 8, 300, 16, 1
    return args


MIXED_BUDGET = 2 * 1024**3
MIXED = (3500, [100] * 31)  # the long prompt, and the short ones beside it


def token_bytes(model: str) -> int:
    """Keys and values of one token over the model's layers, in float32 (the CPU's dtype)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model, local_files_only=True)
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head * 4


def mixed_run(cache: Path, work: Path, model: str, max_tokens: int, env: dict[str, str]) -> dict:
    """The mixed load once: the peak of the cache's own count of the bytes it holds, beside what the tokens need."""
    import threading

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    long, short = MIXED
    texts = [tokenizer.decode(prompt_ids(model, long + 1)[1:])]
    stream = prompt_ids(model, 100 + 7 * len(short))[1:]
    texts += [tokenizer.decode(stream[7 * i: 7 * i + length - 1]) for i, length in enumerate(short)]
    server = OurServer(cache, work, **env)
    peak, done = [0.0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            usage = engine_counter(server.base_url, "vllm:kv_cache_usage_perc") or 0.0
            peak[0] = max(peak[0], usage)
            done.wait(0.05)
    try:
        asyncio.run(run_load(server.base_url, model, texts[:1], 1, 2, {"ignore_eos": True}))  # loads the model
        loaded = rss_mb(server.pid)
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        result = asyncio.run(run_load(server.base_url, model, texts, len(texts), max_tokens, {"ignore_eos": True}))
        done.set()
        watcher.join()
        rss_peak = rss_mb(server.pid, "VmHWM")
    finally:
        server.stop()
    per_token = token_bytes(model)
    needed = (long + max_tokens + sum(short) + len(short) * max_tokens) * per_token
    held = peak[0] * MIXED_BUDGET
    return {"errors": result.summary()["errors"], "tokens_per_s": result.summary()["tokens_per_s"],
            "held_peak_mb": round(held / 2**20, 1),
            "tokens_need_mb": round(needed / 2**20, 1), "held_over_needed": round(held / needed, 2),
            "rss_peak_over_loaded_mb": round(rss_peak - loaded, 1)}


def prompts(model: str, streams: int, length: int) -> list[str]:
    """Distinct texts of about `length` tokens (each starts at another offset of the same stream)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    stream = prompt_ids(model, length + 7 * streams)[1:]
    return [tokenizer.decode(stream[7 * i: 7 * i + length - 1]) for i in range(streams)]


def one_run(cache: Path, work: Path, root: Path | None, model: str, texts: list[str], max_tokens: int,
            env: dict[str, str] | None = None) -> dict:
    server = OurServer(cache, work, root=root, **(env or {}))
    try:
        asyncio.run(run_load(server.base_url, model, texts[:1], 1, 2, {"ignore_eos": True}))  # loads the model
        loaded = rss_mb(server.pid)
        result = asyncio.run(run_load(server.base_url, model, texts, len(texts), max_tokens, {"ignore_eos": True}))
        peak = rss_mb(server.pid, "VmHWM")
        preemptions = engine_counter(server.base_url, "vllm:num_preemptions_total")
    finally:
        server.stop()
    summary = result.summary()
    return {"tokens_per_s": summary["tokens_per_s"], "errors": summary["errors"], "ttft_p50_ms": summary["ttft_p50_ms"],
            "itl_p50_ms": summary["itl_p50_ms"], "rss_loaded_mb": loaded, "rss_peak_mb": peak,
            "peak_over_loaded_mb": round(peak - loaded, 1), "preemptions": preemptions}


def engine_counter(base_url: str, name: str) -> float | None:
    """A counter's total over its labels on the server's /metrics (None: a server that has none)."""
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=30).text
    values = [float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)]
    return sum(values) if values else None


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    cache = prepare_cache()
    ensure_model(args.model, args.size, cache)
    if args.mixed:
        env = dict(item.split("=", 1) for item in args.server_env)
        work = Path(tempfile.mkdtemp(prefix="bench-memory-mixed-"))
        rounds = [mixed_run(cache, work / f"round-{index}", args.model, args.max_tokens, env)
                  for index in range(args.rounds)]
        for index, one in enumerate(rounds):
            print(f"round {index + 1}: {one}", flush=True)
        results = {"scenario": "memory --mixed", "model": args.model, "rounds": rounds,
                   "held_over_needed_median": statistics.median(r["held_over_needed"] for r in rounds)}
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "memory-mixed.json").write_text(json.dumps(results, indent=2))
        print(f"KV bytes held at peak over the bytes of the tokens held: {results['held_over_needed_median']}x "
              f"(median of {len(rounds)} rounds)")
        return
    texts = prompts(args.model, args.streams, args.prompt_tokens)
    work = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    baseline = GitRef(args.baseline_ref, work / "baseline-checkout") if args.baseline_ref else None
    runs: dict[str, list[dict]] = {"ours": [], **({args.baseline_ref: []} if baseline else {})}
    try:
        for index in range(args.rounds):
            for name in runs:
                root = baseline.root if name != "ours" else None
                env = dict(item.split("=", 1) for item in args.server_env) if name == "ours" else None
                runs[name].append(one_run(cache, work / f"{name}-{index}", root, args.model, texts, args.max_tokens, env))
                print(f"round {index + 1} {name}: {runs[name][-1]}", flush=True)
    finally:
        if baseline:
            baseline.remove()
    results: dict = {"scenario": "memory", "model": args.model, "streams": args.streams,
                     "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens, "runs": runs}
    if baseline:
        theirs = runs[args.baseline_ref]
        results["ours_over_baseline"] = {
            key: round(statistics.median(o[key] / t[key] for o, t in zip(runs["ours"], theirs) if t[key]), 2)
            for key in ("tokens_per_s", "peak_over_loaded_mb")}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "memory.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results.get("ours_over_baseline", {})))
    print(f"written to {args.out / 'memory.json'}")
