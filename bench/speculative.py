"""`python -m bench.run --scenario speculative`: n-gram speculative decoding on the real SmolLM2-135M-Instruct.

One server without speculation, then one with `--speculative-config` (vLLM's JSON), each answering greedily
through the openai SDK: 1 stream of an input-grounded task (copy a ~130-token passage replacing one word),
1 stream of open chat (no overlap with the prompt), then `--streams` mixed streams (half copy, half chat).
Beside them, `model.generate` in this process on the copy prompt, without and with transformers' own
`prompt_lookup_num_tokens=10`. Prints tok/s, the ratios, the answers' equality (greedy output must be the
same with and without), and the server's drafted/accepted counts from /metrics. On a shared machine say so.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import httpx

from .models import prepare_cache
from .servers import OurServer

ROOT = Path(__file__).resolve().parent.parent
PASSAGE = ("The lighthouse stood at the edge of the northern cliffs, where the wind never stopped and the sea was "
           "always grey. Every evening the keeper climbed the one hundred and twelve steps to the lamp room, "
           "cleaned the great lens with a soft cloth, and lit the wick before the sun went down. Ships passing in "
           "the night saw the light turn slowly, once every ten seconds, and knew that the rocks were near. In "
           "winter the storms came one after another, and the keeper wrote in his logbook the strength of each "
           "wind, the height of the waves, and the names of the ships that had passed safely.")
COPY = f"Copy the following passage exactly, but replace the word \"keeper\" with \"guardian\".\n\n{PASSAGE}"
CHAT = "Write a short poem about autumn in the mountains, in your own words."
SPEC = {"method": "ngram", "num_speculative_tokens": 24, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run --scenario speculative", description=__doc__)
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--stream-tokens", type=int, default=64, help="tokens per stream of the mixed round")
    parser.add_argument("--spec", default=json.dumps(SPEC), help="the --speculative-config JSON")
    parser.add_argument("--alternate", type=int, default=0, metavar="ROUNDS",
                        help="also keep both servers up and run the mixed round ROUNDS times each, alternately "
                             "(the mixed round swings with the cores' load more than between two servers run in turn)")
    parser.add_argument("--quick", action="store_true", help="48 tokens, 4 mixed streams of 16")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.max_tokens, args.streams, args.stream_tokens = 48, 4, 16
    return args


def one_stream(base_url: str, model: str, prompt: str, max_tokens: int) -> dict:
    """One greedy chat answer, timed (best of two; the first run also warms up)."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=600)
    best = None
    for _ in range(2):
        started = time.perf_counter()
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                               max_tokens=max_tokens, temperature=0)
        seconds = time.perf_counter() - started
        tokens = reply.usage.completion_tokens
        if best is None or tokens / seconds > best["tokens_per_s"]:
            best = {"tokens": tokens, "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds, 1),
                    "text": reply.choices[0].message.content}
    return best


def many_streams(base_url: str, model: str, streams: int, max_tokens: int) -> dict:
    """`streams` greedy answers at once, half copy and half chat: total tokens / wall time."""
    from openai import AsyncOpenAI

    async def run() -> list[int]:
        client = AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=600)
        prompts = [COPY if i % 2 == 0 else CHAT for i in range(streams)]
        replies = await asyncio.gather(*(client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": p}], max_tokens=max_tokens, temperature=0,
            extra_body={"ignore_eos": True}) for p in prompts))
        return [reply.usage.completion_tokens for reply in replies]

    started = time.perf_counter()
    tokens = sum(asyncio.run(run()))
    seconds = time.perf_counter() - started
    return {"tokens": tokens, "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds, 1)}


def spec_counts(base_url: str) -> dict:
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=30).text
    wanted = {"vllm:spec_decode_num_drafts_total": "drafts", "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
              "vllm:spec_decode_num_accepted_tokens_total": "accepted_tokens",
              "inference_spec_decode_mean_accepted_length": "mean_accepted_length"}
    counts = {}
    for line in text.splitlines():
        name = line.split("{")[0]
        if name in wanted:
            counts[wanted[name]] = float(line.split()[-1])
    return counts


def serve_round(cache: Path, model: str, args: argparse.Namespace, spec: str | None) -> dict:
    env = {"INFERENCE_SPECULATIVE_CONFIG": spec} if spec else {}
    server = OurServer(cache, Path(tempfile.mkdtemp(prefix="bench-spec-")), dtype="float32", **env)
    try:
        copy = one_stream(server.base_url, model, COPY, args.max_tokens)
        chat = one_stream(server.base_url, model, CHAT, args.max_tokens)
        mixed = many_streams(server.base_url, model, args.streams, args.stream_tokens)
        counts = spec_counts(server.base_url) if spec else {}
    finally:
        server.stop()
    return {"copy": copy, "chat": chat, "mixed": mixed, "speculation": counts}


def alternate_mixed(cache: Path, model: str, args: argparse.Namespace) -> list[dict]:
    """Both servers up side by side, the mixed round run on each in turn, `args.alternate` times."""
    servers = [OurServer(cache, Path(tempfile.mkdtemp(prefix="bench-spec-")), dtype="float32", **env)
               for env in ({}, {"INFERENCE_SPECULATIVE_CONFIG": args.spec})]
    try:
        for server in servers:
            one_stream(server.base_url, model, COPY, 16)  # warm
        rounds = []
        for _ in range(args.alternate):
            plain, spec = (many_streams(s.base_url, model, args.streams, args.stream_tokens)["tokens_per_s"]
                           for s in servers)
            rounds.append({"without": plain, "with": spec, "ratio": round(spec / plain, 2)})
        return rounds
    finally:
        for server in servers:
            server.stop()


def raw_generate(cache: Path, model_id: str, max_tokens: int) -> dict:
    """`model.generate` on the copy prompt in this process: plain, and with prompt_lookup_num_tokens=10."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_id, cache_dir=cache, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_id, cache_dir=cache, local_files_only=True,
                                                 dtype=torch.float32).eval()
    ids = tokenizer.apply_chat_template([{"role": "user", "content": COPY}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)

    def timed(**extra) -> float:
        best = 0.0
        for _ in range(2):
            started = time.perf_counter()
            with torch.no_grad():
                out = model.generate(**ids, max_new_tokens=max_tokens, do_sample=False, **extra)
            tokens = out.shape[1] - ids["input_ids"].shape[1]
            best = max(best, tokens / (time.perf_counter() - started))
        return round(best, 1)

    return {"copy_tokens_per_s": timed(), "copy_prompt_lookup_tokens_per_s": timed(prompt_lookup_num_tokens=10)}


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    cache = prepare_cache()
    from workers.tiny.smollm2 import build_smollm2

    model = build_smollm2(cache)
    plain = serve_round(cache, model, args, None)
    spec = serve_round(cache, model, args, args.spec)
    raw = raw_generate(cache, model, args.max_tokens)
    alternated = alternate_mixed(cache, model, args) if args.alternate else []
    ratio = {key: round(spec[key]["tokens_per_s"] / plain[key]["tokens_per_s"], 2) for key in ("copy", "chat", "mixed")}
    results = {"scenario": "speculative", "model": model, "spec": json.loads(args.spec),
               "max_tokens": args.max_tokens, "streams": args.streams, "stream_tokens": args.stream_tokens,
               "without": plain, "with": spec, "generate": raw, "with_over_without": ratio,
               "copy_over_generate_prompt_lookup": round(spec["copy"]["tokens_per_s"]
                                                         / raw["copy_prompt_lookup_tokens_per_s"], 2),
               "same_answers": {key: plain[key]["text"] == spec[key]["text"] for key in ("copy", "chat")},
               "mixed_alternated": alternated}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "speculative.json").write_text(json.dumps(results, indent=2))
    for key in ("copy", "chat", "mixed"):
        print(f"{key}: {plain[key]['tokens_per_s']} -> {spec[key]['tokens_per_s']} tok/s ({ratio[key]}x)")
    if alternated:
        print("mixed, alternated:", ", ".join(f"{r['without']} -> {r['with']} ({r['ratio']}x)" for r in alternated))
    print(f"generate copy: {raw['copy_tokens_per_s']}, with prompt lookup 10: {raw['copy_prompt_lookup_tokens_per_s']}")
    print(json.dumps({k: results[k] for k in ("same_answers", "copy_over_generate_prompt_lookup")}),
          json.dumps(spec["speculation"]))
    print(f"written to {args.out / 'speculative.json'}")
