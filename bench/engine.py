"""`python -m bench.run --scenario engine`: the engine in-process (no HTTP, no channel layer) against raw
`generate` and against the forward floor, per model.

For each model, in one process and interleaved rounds: raw padded `model.generate` of the prompts (greedy,
EOS held off); the *floor*, a bare loop of the model's forward over a left-padded batch with a static
cache and an argmax (what any engine pays for the same tokens); and our engine (workers/engine) with the
same prompts submitted at once as jobs, from the first submit to the last answer. Reports tok/s of each,
engine/raw and engine/floor, the engine's mean step and batch (its own histograms), and its host time
per row per step outside the forward (its step minus the floor's, over the rows).

`--families` measures one tiny model per kind of cache (workers/tiny/families.py: full attention, MLA,
sliding windows, linear attention, Mamba) at 16 streams instead: a row per cache type.
"""
from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import uuid
from pathlib import Path

import torch

from .models import ensure_model, prepare_cache, prompt_ids

ROOT = Path(__file__).resolve().parent.parent
# One family per kind of cache (docs/engine.md, "Every architecture").
CACHE_KINDS = {"llama": "full attention", "deepseek-v3": "full (MLA)", "mistral": "sliding window",
               "gemma3": "sliding + full", "qwen3.5": "linear attention + full", "jamba": "Mamba + full",
               "mamba": "Mamba"}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run --scenario engine", description=__doc__)
    parser.add_argument("--model", default="local/tiny-llama")
    parser.add_argument("--size", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--families", action="store_true", help="a row per kind of cache at 16 streams")
    parser.add_argument("--non-streaming", action="store_true", help="jobs answered whole (the output thread only "
                        "gathers tokens) instead of streamed (each row's text and a message every step)")
    parser.add_argument("--quick", action="store_true", help="8 requests x 8 tokens, one round: checks it runs")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.families:
        args.requests = min(args.requests, 16)
    if args.quick:
        args.requests, args.max_tokens, args.rounds = 8, 8, 1
    return args


def load(model_id: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_id, local_files_only=True,
                                                adapter_kwargs={"local_files_only": True}).eval()


def raw_generate(model, prompts: list[list[int]], tokens: int) -> float:
    """Seconds for padded greedy `generate` of `tokens` new tokens per prompt (EOS held off)."""
    pad = model.generation_config.pad_token_id or 0
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    started = time.perf_counter()
    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens,
                       do_sample=False, pad_token_id=pad)
    return time.perf_counter() - started


def floor_loop(model, prompts: list[list[int]], tokens: int) -> tuple[float, float]:
    """(seconds, ms per decode step) of the bare loop: one padded prefill, then forward + argmax per token
    over a static cache (a dynamic one where the model has no static form)."""
    from transformers import DynamicCache, StaticCache

    from workers.engine.execution.kv.specs import forward_arguments

    cache_arg, takes_positions = forward_arguments(model)
    pad = model.generation_config.pad_token_id or 0
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    try:
        cache = StaticCache(config=model.config, max_cache_len=width + tokens)
    except Exception:
        cache = DynamicCache(config=model.config)
    extra = (lambda p: {"position_ids": p}) if takes_positions else (lambda p: {})
    started = time.perf_counter()
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1,
                       **{cache_arg: cache}, **extra(positions)).logits
        next_ids = logits[:, -1].argmax(-1, keepdim=True)
        decode_started = time.perf_counter()
        for step in range(tokens - 1):
            mask = torch.cat([mask, torch.ones_like(next_ids)], dim=-1)
            positions = positions[:, -1:] + 1
            logits = model(input_ids=next_ids, attention_mask=mask, use_cache=True, logits_to_keep=1,
                           **{cache_arg: cache}, **extra(positions)).logits
            next_ids = logits[:, -1].argmax(-1, keepdim=True)
        next_ids.tolist()
    ended = time.perf_counter()
    return ended - started, (ended - decode_started) / max(1, tokens - 1) * 1000


def engine_counters() -> dict[str, float]:
    from prometheus_client import REGISTRY

    return {name: REGISTRY.get_sample_value(name) or 0.0
            for name in ("inference_step_seconds_sum", "inference_step_seconds_count", "inference_batch_size_sum")}


def _serve_engine(requests: int, stream: bool, connection) -> None:
    """The child process: an Engine answering into a dict, running what the pipe asks, until None."""
    import protocol
    from workers.engine.config import EngineConfig
    from workers.engine.core.engine import Engine

    done, finished, errors = threading.Condition(), set(), []

    def emit(channel: str, message: dict) -> None:
        if message["type"] in (protocol.DONE, protocol.ERROR):
            with done:
                finished.add(channel)
                if message["type"] == protocol.ERROR:
                    errors.append(message)
                done.notify_all()

    engine = Engine(emit, EngineConfig(max_num_seqs=requests, max_queue=requests * 2, device="cpu"))
    engine.start()
    try:
        while (asked := connection.recv()) is not None:
            model_id, prompts, tokens = asked
            replies = [f"reply.{uuid.uuid4().hex}" for _ in prompts]
            before = engine_counters()
            clock_before = engine.scheduler.clock.snapshot()
            started = time.perf_counter()
            for reply, prompt in zip(replies, prompts):
                engine.submit(protocol.submit_message(
                    f"cmpl-{uuid.uuid4().hex}", reply, protocol.ModelRef.parse(model_id), [prompt],
                    protocol.JobParams(temperature=0, max_tokens=tokens, ignore_eos=True, stream=stream)))
            with done:
                answered = done.wait_for(lambda: finished.issuperset(replies), 900)
            seconds = time.perf_counter() - started
            connection.send({"seconds": seconds if answered else None, "errors": len(errors),
                             **{key: value - before[key] for key, value in engine_counters().items()},
                             "clock": {key: value - clock_before[key]
                                       for key, value in engine.scheduler.clock.snapshot().items()}})
    finally:
        engine.stop()


class EngineProcess:
    """Our engine in a process of its own (raw `generate` in the same process after an engine thread ran
    torch would pay for a second OpenMP team on the same cores); `run` times one batch of jobs there."""

    def __init__(self, requests: int, stream: bool = True) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_serve_engine, args=(requests, stream, child), daemon=True)
        self.process.start()

    def run(self, model_id: str, prompts: list[list[int]], tokens: int) -> dict:
        """Seconds from the first submit to the last answer, and the engine's step counters meanwhile."""
        self.connection.send((model_id, prompts, tokens))
        result = self.connection.recv()
        if result["seconds"] is None:
            raise RuntimeError("the engine did not answer in 900 s")
        return result

    def stop(self) -> None:
        self.connection.send(None)
        self.process.join(30)


def measure(model_id: str, args: argparse.Namespace, engine: EngineProcess) -> dict:
    model = load(model_id)
    base = prompt_ids(model_id, args.prompt_len + args.requests)
    prompts = [base[index:index + args.prompt_len + index % 4] for index in range(args.requests)]
    engine.run(model_id, prompts[:2], 2)  # loaded and warm before anything is timed
    raw_generate(model, prompts[:2], 2)
    tokens = args.requests * args.max_tokens
    rounds = []
    for _ in range(args.rounds):
        raw_s = raw_generate(model, prompts, args.max_tokens)
        floor_s, floor_step_ms = floor_loop(model, prompts, args.max_tokens)
        ran = engine.run(model_id, prompts, args.max_tokens)
        engine_s, steps = ran["seconds"], ran["inference_step_seconds_count"]
        step_ms = ran["inference_step_seconds_sum"] / max(1, steps) * 1000
        batch = ran["inference_batch_size_sum"] / max(1, steps)
        rounds.append({"raw_tokens_per_s": round(tokens / raw_s, 1), "floor_tokens_per_s": round(tokens / floor_s, 1),
                       "engine_tokens_per_s": round(tokens / engine_s, 1), "engine_over_raw": round(raw_s / engine_s, 3),
                       "engine_over_floor": round(floor_s / engine_s, 3), "engine_step_ms": round(step_ms, 3),
                       "floor_step_ms": round(floor_step_ms, 3), "batch_mean": round(batch, 1),
                       "host_us_per_row_step": round((step_ms - floor_step_ms) * 1000 / max(1.0, batch), 1),
                       "split_ms": step_split(ran["clock"])})
        print(f"  {model_id}: {rounds[-1]}", flush=True)
    keys = rounds[0].keys()
    return {"model": model_id, "streams": args.requests, "max_tokens": args.max_tokens,
            **{key: round(statistics.median(r[key] for r in rounds), 3) for key in keys if key != "split_ms"},
            "split_ms": rounds[len(rounds) // 2]["split_ms"], "rounds": rounds}


def step_split(clock: dict) -> dict[str, float]:
    """Milliseconds per step in each phase (workers/engine/step_clock.py), from the clock's sums over a run."""
    steps = max(1, clock.pop("steps", 0))
    return {phase: round(seconds / steps * 1000, 3) for phase, seconds in clock.items()}


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    cache = prepare_cache()
    if args.families:
        from workers.tiny.families import build_tiny_families

        families = list(CACHE_KINDS)[:2] if args.quick else list(CACHE_KINDS)
        build_tiny_families(families, cache_dir=cache)
        models = {f"local/tiny-{family}": CACHE_KINDS[family] for family in families}
    else:
        ensure_model(args.model, args.size, cache)
        models = {args.model: None}
    engine = EngineProcess(args.requests, stream=not args.non_streaming)
    rows = []
    try:
        for model_id, kind in models.items():
            row = measure(model_id, args, engine)
            rows.append({**({"cache": kind} if kind else {}), **row})
        errors = engine.run(next(iter(models)), [], 1)["errors"]
    finally:
        engine.stop()
    report = {"scenario": "engine", "streamed": not args.non_streaming, "rows": rows, "errors": errors}
    if not args.families:
        report.update({key: rows[0][key] for key in ("engine_over_raw", "engine_over_floor", "host_us_per_row_step")})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "engine.json").write_text(json.dumps(report, indent=2))
    for row in rows:
        print(f"{row.get('cache', row['model'])}: engine {row['engine_tokens_per_s']} tok/s = "
              f"{row['engine_over_raw']}x raw generate, {row['engine_over_floor']}x the floor; "
              f"host {row['host_us_per_row_step']} us/row/step; a step's ms by phase {row['split_ms']}")
    print(f"written to {args.out / 'engine.json'}")
