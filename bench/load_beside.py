"""Streams of a loaded model while another model loads: their speed against the same streams
with nothing loading, measured in interleaved rounds on one embedded server.

Each round runs N streams of `--model` twice: once alone (rate over a window after they are all
under way), once while `/load_model` loads `--loading` and `/unload_model` unloads it again, back
to back for the same window. The figure is the median over rounds of loaded-rate / alone-rate
(the target is >= 0.8: a load must not stall generation).

    python -m bench.load_beside                 # small-llama streams while small-llama-4k loads
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
WINDOW_SECONDS = 3.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="local/small-llama", help="the model whose streams are measured")
    parser.add_argument("--loading", default="local/small-llama-4k", help="the model loaded meanwhile (built if missing)")
    parser.add_argument("--streams", type=positive_int, default=4)
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument("--max-tokens", type=positive_int, default=400)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "load_beside.json")
    return parser.parse_args()


def rate(times: list[list[float]], start: float, end: float) -> float:
    """Text chunks per second, all streams together, within [start, end]."""
    return sum(start <= t <= end for stream in times for t in stream) / (end - start)


async def one_run(server: OurServer, args, load: bool) -> tuple[float, int]:
    """(chunks/s of the streams in the window, loads done in it).

    With `load`, the window is back-to-back loads and unloads of `--loading` for WINDOW_SECONDS
    (one load of a small model takes a fraction of a second: too short a window alone).
    """
    url = f"{server.base_url}/completions"
    body = {"model": args.model, "prompt": "Once upon a time", "max_tokens": args.max_tokens, "ignore_eos": True}
    loads = 0
    async with httpx.AsyncClient(timeout=300) as http:
        streams = [asyncio.ensure_future(stream_once(http, url, {}, body)) for _ in range(args.streams)]
        await asyncio.sleep(WARM_SECONDS)
        start = time.monotonic()
        while time.monotonic() < start + WINDOW_SECONDS:
            if not load:
                await asyncio.sleep(WINDOW_SECONDS)
                continue
            response = await http.post(f"{server.server.base_url}/load_model", json={"model": args.loading})
            assert '"status":"ready"' in response.text, response.text[-300:]
            await http.post(f"{server.server.base_url}/unload_model", json={"model": args.loading})
            loads += 1
        end = time.monotonic()
        outcomes = await asyncio.gather(*streams)
    assert all(o.kind == "ok" for o in outcomes), [o.kind for o in outcomes]
    if min(o.times[-1] for o in outcomes) < end:
        raise SystemExit("the streams ended before the window did: raise --max-tokens")
    return rate([o.times for o in outcomes], start, end), loads


def main() -> None:
    args = parse_args()
    from huggingface_hub import constants

    cache = Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE)
    ensure_model(args.model, "small", cache)
    ensure_model(args.loading, "small-4k", cache)
    server = OurServer(cache, Path(tempfile.mkdtemp(prefix="load-beside-")), INFERENCE_MODEL_TIMEOUT="-1")
    rounds = []
    try:
        asyncio.run(one_run(server, args, load=False))  # warm: the measured model loaded, code paths hot
        for _ in range(args.rounds):
            alone, _ = asyncio.run(one_run(server, args, load=False))
            beside, loads = asyncio.run(one_run(server, args, load=True))
            rounds.append({"alone_chunks_per_s": round(alone, 1), "while_loading_chunks_per_s": round(beside, 1),
                           "loads_in_window": loads, "ratio": round(beside / alone, 3)})
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
