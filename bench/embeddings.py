"""`python -m bench.run --scenario embeddings`: 1,000 short texts embedded through the server vs. in-process.

Ours: the OpenAI SDK's `client.embeddings.create(input=[...])`, `--per-request` texts per request,
`--concurrency` requests in flight, through HTTP, the channel layer and the worker's batched forward
(`INFERENCE_EMBEDDING_BATCH` set to the same batch size). The baseline: sentence-transformers'
`SentenceTransformer(snapshot).encode(texts, batch_size=...)` on the same model in this process.
Interleaved rounds; reports texts/s of each, the ratio (median of the per-round ratios) and the
largest difference between the two's vectors (they must agree, else the figures mean nothing).
The model is a random encoder with all-MiniLM-L6-v2's shapes (6 layers, 384 wide; the most used
sentence-transformers model), built offline; `--shape tiny` (and `--quick`) use the tests' tiny encoder,
whose forward costs almost nothing, so the figure is then the server's fixed cost per request.
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

from .models import prepare_cache
from .servers import OurServer

ROOT = Path(__file__).resolve().parent.parent
SETTLE_SECONDS = 2.5  # the server gives up torch threads while another process is busy (workers/engine/cpu_share.py)
WORDS = ["lighthouse", "river", "robot", "market", "winter", "letter", "garden", "map", "train", "violin", "harbor",
         "clock", "mountain", "lantern", "library", "kite"]


MINILM_SHAPED = "local/minilm-shaped-encoder"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run --scenario embeddings", description=__doc__)
    parser.add_argument("--model", default=MINILM_SHAPED)
    parser.add_argument("--shape", default="minilm", choices=["tiny", "minilm"],
                        help="the shape to build if the model is missing: all-MiniLM-L6-v2's (6 layers, 384 wide), "
                             "or the tests' tiny one (2 layers, 64 wide: a forward costs almost nothing)")
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=32,
                        help="texts per forward: the server's INFERENCE_EMBEDDING_BATCH and encode's batch_size")
    parser.add_argument("--per-request", type=int, default=100,
                        help="texts per request (100: LlamaIndex's embed_batch_size; LangChain sends up to 1,000)")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight at once")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment setting for our server (repeatable)")
    parser.add_argument("--quick", action="store_true", help="96 texts, batches of 16, 2 in flight, one round")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.texts, args.batch_size, args.per_request, args.concurrency, args.rounds = 96, 16, 16, 2, 1
        if args.model == MINILM_SHAPED:  # checks it runs: the tiny shape builds in a moment
            args.model, args.shape = "local/tiny-encoder", "tiny"
    return args


def short_texts(count: int) -> list[str]:
    """Short texts of 3 to 18 words, each different."""
    return [" ".join([f"note {i}:"] + [WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(1 + i % 16)])
            for i in range(count)]


def ensure_encoder(model: str, cache: Path, shape: str = "minilm") -> Path:
    """The encoder's snapshot, built offline if the cache lacks it."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(model, cache_dir=cache, local_files_only=True))
    except Exception:  # not in the cache (huggingface_hub raises one of several errors offline)
        from workers.tiny.encoder import build_tiny_encoder

        print(f"building {model} (a random encoder of {shape} shape) into {cache}", flush=True)
        return build_tiny_encoder(model, cache_dir=cache, shape=shape)


async def through_server(base_url: str, model: str, texts: list[str], per_request: int, concurrency: int):
    """(seconds, vectors in input order): every text embedded, `per_request` a request, `concurrency` in flight."""
    client = AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=600)
    gate = asyncio.Semaphore(concurrency)

    async def one(batch: list[str]):
        async with gate:
            response = await client.embeddings.create(model=model, input=batch)
            return [item.embedding for item in sorted(response.data, key=lambda item: item.index)]

    started = time.perf_counter()
    answers = await asyncio.gather(*[one(texts[i:i + per_request]) for i in range(0, len(texts), per_request)])
    seconds = time.perf_counter() - started
    await client.close()
    return seconds, [vector for answer in answers for vector in answer]


def main(argv: list[str]) -> None:
    import numpy as np
    from sentence_transformers import SentenceTransformer

    args = parse_args(argv)
    cache = prepare_cache()
    snapshot = ensure_encoder(args.model, cache, args.shape)
    texts = short_texts(args.texts)
    reference = SentenceTransformer(str(snapshot), device="cpu")
    reference.encode(texts, batch_size=args.batch_size)  # warm-up: its first batches of each shape are slow
    env = {"INFERENCE_EMBEDDING_BATCH": str(args.batch_size), **dict(item.split("=", 1) for item in args.server_env)}
    server = OurServer(cache, Path(tempfile.mkdtemp(prefix="bench-embeddings-")), **env)
    rounds = []
    max_diff = None
    try:
        asyncio.run(through_server(server.base_url, args.model, texts[:args.batch_size], args.batch_size, 1))  # loads it
        for index in range(args.rounds):
            started = time.perf_counter()
            expected = reference.encode(texts, batch_size=args.batch_size)
            local_s = time.perf_counter() - started
            time.sleep(SETTLE_SECONDS)
            ours_s, vectors = asyncio.run(through_server(server.base_url, args.model, texts, args.per_request,
                                                         args.concurrency))
            if max_diff is None:
                max_diff = float(np.abs(np.asarray(vectors, dtype=np.float32) - expected).max())
            row = {"in_process_texts_per_s": round(len(texts) / local_s, 1),
                   "server_texts_per_s": round(len(texts) / ours_s, 1), "ratio": round(local_s / ours_s, 3)}
            rounds.append(row)
            print(f"round {index + 1}/{args.rounds}: {row}", flush=True)
    finally:
        server.stop()
    summary = {
        "scenario": "embeddings", "model": args.model, "texts": len(texts), "batch_size": args.batch_size,
        "per_request": args.per_request, "concurrency": args.concurrency, "rounds": rounds, "max_abs_diff": max_diff,
        "server_texts_per_s": statistics.median(r["server_texts_per_s"] for r in rounds),
        "in_process_texts_per_s": statistics.median(r["in_process_texts_per_s"] for r in rounds),
        "ratio_median": statistics.median(r["ratio"] for r in rounds),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "embeddings.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k != "rounds"}, indent=2))
