"""`python -m bench.run --scenario gpu`: raw `generate`, transformers' `generate_batch` and ours, one GPU, one run.

Per model shape (random weights with the shapes of Qwen2.5-0.5B and Llama-3-8B, built offline into the
Hugging Face cache; `bench/shapes.py`), in the benchmark's process: raw padded `model.generate` and
transformers' continuous batching (`model.generate_batch`) at `--sizes` prompts at once; then, with that
model freed, our server (`manage.py serve --device/--dtype` as a subprocess) over HTTP with the streaming
client at `--server-sizes` concurrent streams (`--waves` waves of requests each, at most `--max-requests`;
each level after an untimed 4-token wave at its size).
Greedy, `--max-tokens` new tokens, EOS ignored, prompts of ~`--prompt-len` tokens that share no prefix.

Reports tok/s of each, ours/raw and ours/generate_batch at the sizes both ran, our TTFT, the engine's
mean step time and batch (its Prometheus histograms), the GPU's busy % during each run (sampled; null on
CPU) and the HBM floor of a decode step: the weights' bytes over `--hbm-gbps` (null on CPU). Writes
`gpu.json` and `gpu.md` under `--out`. `--quick` runs the `tiny` shape on the CPU in a few seconds: it
checks the scenario works. On a GPU machine without internet, see `../shared/gpu/README.md`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

from .gpu_busy import GpuBusy
from .gpu_report import markdown
from .load import run_load
from .models import prepare_cache
from .overhead import engine_counters, per_step
from .servers import OurServer
from .shapes import SHAPES, ensure_shape, shape_prompts

ROOT = Path(__file__).resolve().parent.parent


def int_list(text: str) -> list[int]:
    values = [int(item) for item in text.split(",") if item.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"a comma-separated list of positive integers, not {text!r}")
    return values


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run --scenario gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="qwen05,llama8b", help=f"comma-separated, of {sorted(SHAPES)}")
    parser.add_argument("--device", default="cuda", help="the server's --device and the in-process runs'")
    parser.add_argument("--dtype", default="bfloat16", choices=("auto", "float32", "float16", "bfloat16"))
    parser.add_argument("--sizes", type=int_list, default=[1, 16, 64],
                        help="prompts at once for raw generate and generate_batch")
    parser.add_argument("--server-sizes", type=int_list, default=[1, 16, 64, 256], help="our concurrent streams")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=128, help="about this many tokens a prompt")
    parser.add_argument("--waves", type=int, default=2, help="requests per server level: waves x concurrency ...")
    parser.add_argument("--max-requests", type=int, default=256, help="... but no more than this (or one wave)")
    parser.add_argument("--hbm-gbps", type=float, default=3350.0,
                        help="the device's memory bandwidth in GB/s, for the HBM floor (3350: an H100 SXM)")
    parser.add_argument("--skip", default="", help="comma-separated phases to leave out: raw, generate_batch, server")
    parser.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment setting for our server (repeatable)")
    parser.add_argument("--quick", action="store_true", help="the tiny shape on the CPU, 1 and 4 at once, 8 tokens")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.shapes, args.device, args.dtype = "tiny", "cpu", "float32"
        args.sizes, args.server_sizes, args.max_tokens, args.prompt_len = [1, 4], [1, 4], 8, 32
    args.shapes = [name.strip() for name in args.shapes.split(",") if name.strip()]
    unknown = [name for name in args.shapes if name not in SHAPES]
    if unknown:
        parser.error(f"unknown shapes {unknown}; choose from {sorted(SHAPES)}")
    args.skip = {name.strip() for name in args.skip.split(",") if name.strip()}
    return args


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def guarded(size_key: str, size: int, measure) -> dict:
    """One row; a failure is written into the row (the run goes on to the next), never lost."""
    try:
        return {size_key: size, **measure()}
    except Exception as exc:
        traceback.print_exc()
        return {size_key: size, "error": f"{type(exc).__name__}: {exc}"}


def generate_batch_row(model, tokenizer, prompts: list[str], max_tokens: int, device: str) -> dict:
    """transformers' continuous batching over `prompts` (greedy, EOS off): tok/s of its loop (first request
    admitted to last one done) and of the whole call (its set-up and CUDA-graph warm-up included)."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    ids = [tokenizer(prompt)["input_ids"] for prompt in prompts]
    config = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=None,
                              pad_token_id=model.generation_config.pad_token_id)
    # On a GPU its cache takes the free memory, as a user's would. On the CPU it would take most of the
    # machine's RAM (25 s of page faults for 8 tokens): there, a cache that fits these prompts.
    batching = None
    if device == "cpu":
        page = ContinuousBatchingConfig().page_size
        pages_per_prompt = -(-(max(map(len, ids)) + max_tokens) // page)
        batching = ContinuousBatchingConfig(num_blocks=2 * len(ids) * pages_per_prompt + 4)
    sync(device)
    started = time.perf_counter()
    outputs = list(model.generate_batch(inputs=ids, generation_config=config, continuous_batching_config=batching,
                                        max_new_tokens=max_tokens).values())
    sync(device)
    seconds = time.perf_counter() - started
    tokens = sum(len(output.generated_tokens) for output in outputs)
    spans = [output.lifespan for output in outputs if output.lifespan and output.lifespan[0] > 0]
    loop = max(s[1] for s in spans) - min(s[0] for s in spans) if spans else None
    failed = [output.error for output in outputs if output.error is not None]
    # The loop's figure where it has one: the call also sets up a manager and captures CUDA graphs each time,
    # a cost `transformers serve --continuous-batching` pays once (and ours at load).
    row = {"tokens": tokens, "tokens_per_s": round(tokens / (loop or seconds), 1), "seconds_loop": round(loop, 3) if loop
           else None, "seconds_call": round(seconds, 3), "tokens_per_s_call": round(tokens / seconds, 1)}
    if failed:
        row["error"] = f"{len(failed)} of {len(outputs)} requests failed: {failed[0]}"
    return row


def in_process(args: argparse.Namespace, repo: str, tokenizer, busy: GpuBusy) -> dict:
    """Raw padded generate and generate_batch at every `--sizes`, on one copy of the model, then freed."""
    import gc

    import torch

    from .raw import RawEngine

    prompts = shape_prompts(tokenizer, max(args.sizes), args.prompt_len, salt=0)
    raw = RawEngine(repo, prompts, device=args.device, dtype=args.dtype)
    params = sum(p.numel() for p in raw.model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in raw.model.parameters())
    found: dict = {"params_m": round(params / 1e6, 1), "weight_bytes": weight_bytes,
                   "prompt_tokens_mean": round(sum(len(tokenizer(p)["input_ids"]) for p in prompts) / len(prompts), 1),
                   "raw_generate": [], "generate_batch": []}
    try:
        for phase, skip_name, measure in (
                ("raw_generate", "raw", lambda n: raw.padded_tokens_per_s(n, args.max_tokens)),
                ("generate_batch", "generate_batch",
                 lambda n: generate_batch_row(raw.model, raw.tokenizer, prompts[:n], args.max_tokens, args.device))):
            if skip_name in args.skip:
                continue
            for size in args.sizes:
                started = time.monotonic()
                row = guarded("size", size, lambda: measure(size))
                row["gpu_busy_pct"] = busy.busy_pct(started, time.monotonic())
                found[phase].append(row)
                print(f"  {phase} x{size}: {row}", flush=True)
    finally:
        raw.close()
        gc.collect()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()  # the server's process gets the memory
    return found


def requests_at(concurrency: int, waves: int, most: int) -> int:
    """`waves` waves of `concurrency` requests (at least 2), but no more than `most` or one wave."""
    return max(2, min(concurrency * waves, max(concurrency, most)))


def server_levels(args: argparse.Namespace, repo: str, tokenizer, cache: Path, busy: GpuBusy) -> list[dict]:
    """Ours over HTTP at every `--server-sizes`, one server for all of them, its model loaded before timing."""
    env = dict(item.split("=", 1) for item in args.server_env)
    env.setdefault("INFERENCE_MAX_NUM_SEQS", str(max(256, *args.server_sizes)))
    env.setdefault("INFERENCE_MAX_QUEUE", "2048")
    env.setdefault("INFERENCE_WORKER_ACK_TIMEOUT", "300")
    env.setdefault("INFERENCE_MODEL_TIMEOUT", "900")  # 8B from disk onto the GPU
    extra = {"ignore_eos": True, "return_token_ids": True}  # a chunk per token: ITL per token
    server = OurServer(cache, Path(tempfile.mkdtemp(prefix="bench-gpu-")), device=args.device, dtype=args.dtype, **env)
    rows = []
    try:
        asyncio.run(run_load(server.base_url, repo, shape_prompts(tokenizer, 2, args.prompt_len, salt=99), 2, 8, extra))
        for index, concurrency in enumerate(args.server_sizes, 1):
            prompts = shape_prompts(tokenizer, requests_at(concurrency, args.waves, args.max_requests),
                                    args.prompt_len, salt=index)
            # A short untimed wave at this batch size first: what the engine sets up on first use of a size
            # (a CUDA graph captured for its bucket) is not timed, as generate_batch's warm-up is not.
            asyncio.run(run_load(server.base_url, repo, shape_prompts(tokenizer, concurrency, args.prompt_len,
                                                                      salt=1000 + index), concurrency, 4, extra))

            def measure() -> dict:
                before = engine_counters(server.base_url)
                result = asyncio.run(run_load(server.base_url, repo, prompts, concurrency, args.max_tokens, extra))
                errors = [r.error for r in result.results if r.error]
                summary = result.summary()
                del summary["concurrency"]
                return {**summary, "first_error": errors[0] if errors else None,
                        **per_step(before, engine_counters(server.base_url))}

            started = time.monotonic()
            row = guarded("concurrency", concurrency, measure)
            row["gpu_busy_pct"] = busy.busy_pct(started, time.monotonic())
            rows.append(row)
            print(f"  ours c{concurrency}: {row}", flush=True)
    finally:
        server.stop()
    return rows


def compare(found: dict, hbm_floor_ms: float | None) -> None:
    """Each of our rows gains ours/raw and ours/generate_batch (at the same size, where both ran) and its
    step time over the HBM floor."""
    for row in found.get("ours", []):
        for phase, key in (("raw_generate", "ours_raw"), ("generate_batch", "ours_generate_batch")):
            peer = next((r for r in found.get(phase, []) if r["size"] == row["concurrency"] and not r.get("error")), None)
            ok = peer and row.get("tokens_per_s") and not row.get("errors")
            row[key] = round(row["tokens_per_s"] / peer["tokens_per_s"], 2) if ok else None
        step = row.get("step_ms_mean")
        row["step_over_hbm_floor"] = round(step / hbm_floor_ms, 1) if step and hbm_floor_ms else None


def run_shape(args: argparse.Namespace, shape: str, cache: Path, busy: GpuBusy) -> dict:
    from transformers import AutoTokenizer

    repo = ensure_shape(shape, cache, args.device, args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(repo, local_files_only=True)
    print(f"{shape}: {repo}", flush=True)
    found: dict = {"shape": shape, "model": repo, **in_process(args, repo, tokenizer, busy)}
    on_gpu = args.device.startswith("cuda")
    found["hbm_floor_ms"] = round(found["weight_bytes"] / (args.hbm_gbps * 1e9) * 1000, 4) if on_gpu else None
    if "server" not in args.skip:
        try:
            found["ours"] = server_levels(args, repo, tokenizer, cache, busy)
        except Exception as exc:  # the server did not start: the in-process figures still count
            traceback.print_exc()
            found["ours"], found["server_error"] = [], f"{type(exc).__name__}: {exc}"
    compare(found, found["hbm_floor_ms"])
    return found


def environment(args: argparse.Namespace, busy: GpuBusy) -> dict:
    import torch
    import transformers

    on_gpu = args.device.startswith("cuda")
    return {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "python": sys.version.split()[0],
            "torch": torch.__version__, "transformers": transformers.__version__,
            "gpu": torch.cuda.get_device_name(args.device) if on_gpu else None,
            "hbm_gbps": args.hbm_gbps if on_gpu else None, "busy_source": busy.source}


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    cache = prepare_cache()
    busy = GpuBusy(args.device)
    report: dict = {"scenario": "gpu", "device": args.device, "dtype": args.dtype, "max_tokens": args.max_tokens,
                    "prompt_len": args.prompt_len, "sizes": args.sizes, "server_sizes": args.server_sizes,
                    **environment(args, busy), "shapes": []}
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        for shape in args.shapes:
            report["shapes"].append(run_shape(args, shape, cache, busy))
            (args.out / "gpu.json").write_text(json.dumps(report, indent=2))  # each shape kept as it ends
    finally:
        busy.stop()
    (args.out / "gpu.json").write_text(json.dumps(report, indent=2))
    (args.out / "gpu.md").write_text(markdown(report))
    print(markdown(report))
    print(f"written to {args.out}")
