"""`python -m bench.run --scenario web_path`: the web side's CPU per streamed token, without a model or a socket.

Where the server's CPU per streamed token goes beyond the engine's: each token of each stream is read from
its reply channel, joined, shaped into a `text_completion` chunk, framed as SSE and handed to
Django's streaming response. Here the real code of that path runs in one process: `--streams` streams
(GenerationStream, CompletionShaper, sse_response, Django's ASGIHandler.send_response), each fed `--steps`
one-token deltas a step through the in-memory channel layer by a loop standing in for the worker, and each
frame handed to an ASGI `send` that drops it (Daphne, Twisted and the socket are left out). Reports the CPU
µs per frame, median of `--rounds`. The figure moves little with the machine's load (it is CPU time of one
thread), so a change's effect shows in one run: `--root DIR` measures another checkout (a git worktree of
an earlier commit) the same way, in the same run, and reports the ratio.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Run in the checkout measured (its own openai_api and inference_site), printing CPU µs per frame per round.
MEASURE = r'''
import asyncio, os, sys, time
sys.path.insert(0, os.getcwd())
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inference_site.settings")
import django
django.setup()
from django.core.handlers.asgi import ASGIHandler
import protocol
from inference_site.channel_layers import HandoverInMemoryChannelLayer
from openai_api.base import sse_response
from openai_api.completions import CompletionShaper
from openai_api.generation import GenerationStream

STREAMS, STEPS, ROUNDS = (int(value) for value in sys.argv[1:4])


async def one_round() -> None:
    layer, handler = HandoverInMemoryChannelLayer(), ASGIHandler()
    frames = [0]

    async def send(message):
        frames[0] += message.get("body", b"").count(b'"token_ids":[278]')

    channels, responses = [], []
    for index in range(STREAMS):
        channel = await layer.new_channel("reply.")
        stream = GenerationStream(layer, {"request_id": f"cmpl-{index:032x}", "reply_channel": channel})
        stream.started = {"prompt_tokens": [16], "prompt_token_ids": [list(range(16))]}
        shaper = CompletionShaper(stream.request_id, "local/tiny-llama", {"stream": True, "return_token_ids": True},
                                  stream.started)
        channels.append(channel)
        response = sse_response(shaper.chunks(stream), stream)
        responses.append(asyncio.ensure_future(handler.send_response(response, send)))
    for step in range(STEPS):
        for channel in channels:
            delta = {"index": 0, "text": " the", "token_ids": [278], "logprobs": None, "finish_reason": None}
            if step < STEPS - 1:
                await layer.send(channel, protocol.delta_message([delta]))
            else:
                delta["finish_reason"] = "length"
                usage = {"prompt_tokens": 16, "completion_tokens": STEPS}
                await layer.send(channel, protocol.done_message([delta], usage))
        while any(not layer.channels[channel].empty() for channel in channels if channel in layer.channels):
            await asyncio.sleep(0)  # every stream takes its token before the next step, as behind a live engine
    await asyncio.gather(*responses)
    if frames[0] != STREAMS * STEPS:  # every token reached its client, each in a frame of its own
        sys.exit(f"{frames[0]} token frames sent, not {STREAMS * STEPS}")


asyncio.run(one_round())  # warm
for _ in range(ROUNDS):
    started = time.process_time()
    asyncio.run(one_round())
    print((time.process_time() - started) / (STREAMS * STEPS) * 1e6, flush=True)
'''


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run --scenario web_path", description=__doc__)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--root", type=Path, help="also measure this checkout (an earlier commit's worktree)")
    parser.add_argument("--quick", action="store_true", help="8 streams x 16 steps, one round: checks it runs")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.streams, args.steps, args.rounds = 8, 16, 1
    return args


def measure(root: Path, args: argparse.Namespace) -> list[float]:
    """CPU µs per frame, one figure per round, of the checkout at `root`."""
    done = subprocess.run([sys.executable, "-c", MEASURE, str(args.streams), str(args.steps), str(args.rounds)],
                          cwd=root, capture_output=True, text=True, check=True)
    return [round(float(line), 2) for line in done.stdout.split()]


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    report: dict = {"scenario": "web_path", "streams": args.streams, "steps": args.steps}
    checkouts = {"this": ROOT, **({"root": args.root.resolve()} if args.root else {})}
    for name, root in checkouts.items():
        rounds = measure(root, args)
        report[name] = {"checkout": str(root), "cpu_us_per_frame": statistics.median(rounds), "rounds": rounds}
        print(f"  {name} ({root}): {report[name]['cpu_us_per_frame']} µs CPU per frame, rounds {rounds}", flush=True)
    if args.root:
        report["this_over_root"] = round(report["this"]["cpu_us_per_frame"] / report["root"]["cpu_us_per_frame"], 3)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "web_path.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({key: value for key, value in report.items() if key not in ("this", "root")}, indent=2))
    print(f"written to {args.out}")
