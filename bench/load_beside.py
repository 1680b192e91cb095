"""Streams of a loaded model while another model loads: their speed against the same streams
with nothing loading, measured in interleaved rounds on one embedded server.

Each round runs N streams of `--model` twice: once alone (rate over a window after they are all
under way), once while `/load_model` loads `--loading` (rate over exactly the load's duration),
then unloads it again. The figure is the median over rounds of loaded-rate / alone-rate
(the target is >= 0.8: a load must not stall generation).

    python -m bench.load_beside                 # tiny-llama streams while small-llama loads
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.run import ROOT, ensure_model, positive_int
from bench.servers import OurServer
from bench.sse import stream_once

WARM_SECONDS = 1.0
ALONE_WINDOW_SECONDS = 2.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="local/tiny-llama", help="the model whose streams are measured")
    parser.add_argument("--loading", default="local/small-llama", help="the model loaded meanwhile (built if missing)")
    parser.add_argument("--streams", type=positive_int, default=4)
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument("--max-tokens", type=positive_int, default=400)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "load_beside.json")
    return parser.parse_args()


def rate(times: list[list[float]], start: float, end: float) -> float:
    """Text chunks per second, all streams together, within [start, end]."""
    return sum(start <= t <= end for stream in times for t in stream) / (end - start)


async def one_run(server: OurServer, args, load: bool) -> tuple[float, float]:
    """(chunks/s of the streams in the window, window seconds)."""
    url = f"{server.base_url}/completions"
    body = {"model": args.model, "prompt": "Once upon a time", "max_tokens": args.max_tokens, "ignore_eos": True}
    async with httpx.AsyncClient(timeout=300) as http:
        streams = [asyncio.ensure_future(stream_once(http, url, {}, body)) for _ in range(args.streams)]
        await asyncio.sleep(WARM_SECONDS)
        start = time.monotonic()
        if load:
            response = await http.post(f"{server.server.base_url}/load_model", json={"model": args.loading})
            assert '"status":"ready"' in response.text, response.text[-300:]
        else:
            await asyncio.sleep(ALONE_WINDOW_SECONDS)
        end = time.monotonic()
        outcomes = await asyncio.gather(*streams)
        if load:
            await http.post(f"{server.server.base_url}/unload_model", json={"model": args.loading})
    assert all(o.kind == "ok" for o in outcomes), [o.kind for o in outcomes]
    if max(o.times[-1] for o in outcomes) < end:
        raise SystemExit("the streams ended before the window did: raise --max-tokens")
    return rate([o.times for o in outcomes], start, end), end - start


def main() -> None:
    args = parse_args()
    from huggingface_hub import constants

    cache = Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE)
    ensure_model(args.model, "tiny", cache)
    ensure_model(args.loading, "small", cache)
    server = OurServer(cache, Path(tempfile.mkdtemp(prefix="load-beside-")), INFERENCE_MODEL_TIMEOUT="-1")
    rounds = []
    try:
        asyncio.run(one_run(server, args, load=False))  # warm: the measured model loaded, code paths hot
        for _ in range(args.rounds):
            alone, _ = asyncio.run(one_run(server, args, load=False))
            beside, load_seconds = asyncio.run(one_run(server, args, load=True))
            rounds.append({"alone_chunks_per_s": round(alone, 1), "while_loading_chunks_per_s": round(beside, 1),
                           "load_s": round(load_seconds, 2), "ratio": round(beside / alone, 3)})
            print(rounds[-1])
    finally:
        server.stop()
    report = {"model": args.model, "loading": args.loading, "streams": args.streams, "rounds": rounds,
              "median_ratio": round(statistics.median(r["ratio"] for r in rounds), 3), "target": 0.8}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
