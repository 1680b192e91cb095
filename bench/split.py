"""`python -m bench.run --scenario split`: a probe of issue 44's next step, not of the product as it runs.

Where should a streamed answer's output work (detokenizing, a delta message a token) run: in a thread of the
engine's process, as today (workers/engine/output/processor.py), or in another process fed one message of
token ids per engine step, as vLLM's engine core feeds its API server? The same engine, the same jobs (64
streams x 128 tokens of the tiny model, greedy), in a process of its own each time:

- `thread`: today's engine, its output thread doing the work (the emitted messages dropped);
- `split`: the engine with its output processor replaced by a pipe (`PipeOutput`: each step's ids in one
  message, nothing else done in the engine's process), and this process doing the work for every token:
  the incremental detokenizer the output thread uses and a delta message of the text.

Arrangements alternate, `--rounds` processes each, several runs per process; reported: tok/s from the first
submit to the last token, and the CPU of both processes (the engine's and this one's).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import threading
import time
import uuid
from pathlib import Path

from .models import ensure_model, prepare_cache, prompt_ids
from .parsing import process_cpu

ROOT = Path(__file__).resolve().parent.parent
RUNS_PER_PROCESS = 4


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run --scenario split", description=__doc__)
    parser.add_argument("--model", default="local/tiny-llama")
    parser.add_argument("--size", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3, help="processes of each arrangement, alternated")
    parser.add_argument("--torch-threads", type=int, default=0,
                        help="torch threads in the engine's process (0: its thread governor decides)")
    parser.add_argument("--quick", action="store_true", help="8 requests x 8 tokens, one round: checks it runs")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.max_tokens, args.rounds = 8, 8, 1
    return args


def _engine_process(connection, model_id: str, requests: int, tokens: int, split: bool, torch_threads: int
                    ) -> None:
    """The child: an Engine running what the pipe sends; `split`: its output processor replaced by the pipe."""
    import protocol
    import workers.engine.core.engine as engine_module
    from workers.engine.config import EngineConfig

    class PipeOutput:
        """The output processor's interface; each step's (request, token, end) go over the pipe in one message."""

        def __init__(self, emit, answered, finished, tokens, stopped, fault, stream_interval) -> None:
            self.answered = answered

        def start(self) -> None:
            pass

        def stop(self, timeout: float = 5.0) -> None:
            pass

        def problem(self) -> None:
            return None

        thread = None  # the engine's thread governor counts the output thread's CPU: none here

        def wait_idle(self, timeout: float = 5.0) -> bool:
            return True

        def fail(self, request, message: dict) -> None:
            self.answered(request.request_id)

        def step(self, entries: list, when: float) -> None:
            connection.send([(seq.request.request_id, token, reason) for seq, token, _, _, reason in entries])
            for seq, _, _, _, reason in entries:
                if reason is not None:
                    self.answered(seq.request.request_id)

    if split:
        engine_module.OutputProcessor = PipeOutput
    done, finished = threading.Condition(), set()

    def emit(channel: str, message: dict) -> None:
        if message["type"] in (protocol.DONE, protocol.ERROR):
            with done:
                finished.add(channel)
                done.notify_all()

    engine = engine_module.Engine(emit, EngineConfig(max_num_seqs=requests, max_queue=2 * requests, device="cpu",
                                                     torch_threads=torch_threads))
    engine.start()
    try:
        while (prompts := connection.recv()) is not None:
            replies = [f"reply.{uuid.uuid4().hex}" for _ in prompts]
            for reply, prompt in zip(replies, prompts):
                engine.submit(protocol.submit_message(
                    f"cmpl-{uuid.uuid4().hex}", reply, protocol.ModelRef.parse(model_id), [prompt],
                    protocol.JobParams(temperature=0, max_tokens=tokens, ignore_eos=True, stream=True)))
            if not split:
                with done:
                    done.wait_for(lambda: finished.issuperset(replies), 900)
                connection.send("done")
    finally:
        engine.stop()


def _output_work(connection, tokenizer, requests: int) -> int:
    """This process's side of `split`: every token's text and delta message, until `requests` answers end."""
    from workers.engine.output.detokenizer import IncrementalText

    texts: dict[str, tuple[IncrementalText, list[int]]] = {}
    ended = deltas = 0
    while ended < requests:
        for request_id, token, reason in connection.recv():
            if request_id not in texts:
                texts[request_id] = (IncrementalText(tokenizer, []), [])
            text, ids = texts[request_id]
            if token is not None:
                ids.append(token)
                delta, _ = text.update(ids)
                json.dumps({"type": "delta", "choices": [{"index": 0, "text": delta, "token_ids": [token]}]})
                deltas += 1
            ended += reason is not None
    return deltas


def run_process(args: argparse.Namespace, tokenizer, prompts: list[list[int]], split: bool) -> list[dict]:
    context = multiprocessing.get_context("spawn")
    connection, child = context.Pipe()
    process = context.Process(target=_engine_process, daemon=True,
                              args=(child, args.model, args.requests, args.max_tokens, split, args.torch_threads))
    process.start()

    def one(batch: list[list[int]]) -> None:
        connection.send(batch)
        if split:
            _output_work(connection, tokenizer, len(batch))
        else:
            connection.recv()

    try:
        one(prompts[:2])  # loaded and warm
        runs = []
        for _ in range(RUNS_PER_PROCESS):
            cpu = process_cpu(os.getpid())  # this process and the engine's
            started = time.perf_counter()
            one(prompts)
            seconds = time.perf_counter() - started
            cpu = process_cpu(os.getpid()) - cpu
            runs.append({"tokens_per_s": round(len(prompts) * args.max_tokens / seconds, 1), "cpu_s": round(cpu, 3)})
        return runs
    finally:
        connection.send(None)
        process.join(30)


def main(argv: list[str]) -> None:
    from transformers import AutoTokenizer

    args = parse_args(argv)
    cache = prepare_cache()
    ensure_model(args.model, args.size, cache)
    tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    base = prompt_ids(args.model, 16 + args.requests)
    prompts = [base[index:index + 16 + index % 4] for index in range(args.requests)]
    runs: dict[str, list[dict]] = {"thread": [], "split": []}
    for _ in range(args.rounds):
        for arrangement in ("thread", "split"):
            done = run_process(args, tokenizer, prompts, split=arrangement == "split")
            runs[arrangement].extend(done)
            print(f"  {arrangement}: {[run['tokens_per_s'] for run in done]} tok/s, "
                  f"cpu {[run['cpu_s'] for run in done]} s", flush=True)
    medians = {name: {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows),
                      "cpu_s": statistics.median(r["cpu_s"] for r in rows)} for name, rows in runs.items()}
    report = {"scenario": "split", "model": args.model, "requests": args.requests, "max_tokens": args.max_tokens,
              "torch_threads": args.torch_threads,
              "cpus": os.cpu_count(), "runs": runs, "median": medians,
              "split_over_thread": round(medians["split"]["tokens_per_s"] / medians["thread"]["tokens_per_s"], 3),
              "split_cpu_over_thread": round(medians["split"]["cpu_s"] / medians["thread"]["cpu_s"], 3)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "split.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({key: report[key] for key in ("median", "split_over_thread", "split_cpu_over_thread")}, indent=2))
    print(f"written to {args.out}")
