"""`python -m bench.run --scenario types`: every causal-LM `model_type` of the installed transformers through the
engine, against `generate` (issue 46's matrix; a new transformers release adds its new types by itself).

Types checked one after another in a process of this module's own (6 GB of address space, 120 s a type; a type
that kills it is an `error` and a new process goes on): a tiny random-weight model built from the type's
own config defaults (workers/tiny/type_matrix.py), loaded by the server's loader, its runner built (the load-time
checks: what it caches, padded rows, chunked prefill, whether it keeps a cache at all), then 4 prompts prefilled in
chunks of 5 joining the batch one after another, and the same 4 prefilled together, 8 greedy tokens each, every
row compared with `generate` for that prompt alone. A type ends as `equal`, `declined` (refused at load, with the
reason), `WRONG` (other tokens: a bug), or `error` (the tiny build or the check failed; the reason kept). Writes
bench/results/types-*.json and prints a line per type that is not `equal`.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKENS = 6  # greedy tokens each prompt decodes (the suite runs every type: 6 keep it within its time)
TEXTS = ["Hi there", "Once upon a time there was a", "1, 2, 3, 4, 5, 6, 7, 8, 9,",
         "The capital of France is a city on the river"]
QUICK = ["llama", "gpt2", "bart", "mamba", "openai-gpt", "cpmant"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run --scenario types", description=__doc__)
    parser.add_argument("--types", default="", help="comma-separated model types (default: every causal-LM type)")
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    return parser.parse_args(argv)


def check_type(model_type: str, cache: str) -> dict:
    """One type, in this process: built, loaded, its runner, the two batched runs against `generate`."""
    out: dict = {"type": model_type}
    try:
        import torch

        import protocol
        from protocol import ModelRef
        from workers.engine.config import TemplateSettings
        from workers.engine.inputs.generation_job import GenerationJob
        from workers.engine.errors import ModelLoadError
        from workers.engine.execution.input_batch import InputBatch
        from workers.engine.execution.runner import ModelRunner, RunnerSettings, sample_batch
        from workers.engine.models.model_loader import load_model
        from workers.engine.plan import DecodePlan
        from workers.engine.sequences import Handover
        from workers.engine.step_clock import StepClock
        from workers.tiny.type_matrix import build_type_model

        repo = f"local/tiny-{model_type.replace('_', '-')}"
        build_type_model(model_type, repo, cache)
        loaded = load_model(ModelRef.parse(repo), "cpu", "float32")
        try:
            runner = ModelRunner(loaded, RunnerSettings(prefill_chunk=5, max_rows=8, prefix_cache_bytes=0))
        except ModelLoadError as exc:
            try:  # a decline counts only where transformers itself generates with the tiny build
                ids = torch.tensor([loaded.tokenizer(TEXTS[1])["input_ids"]])
                loaded.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False)
            except Exception as broken:
                return {**out, "status": "error",
                        "reason": f"the tiny build does not run generate either: {type(broken).__name__}: "
                                  f"{str(broken)[:200]}"}
            return {**out, "status": "declined", "reason": str(exc)}
        out.update(cache=runner.spec.describe(), notes=list(runner.spec.notes))
        prompts = [loaded.tokenizer(text)["input_ids"] for text in TEXTS]

        def generate(ids: list[int]) -> list[int]:
            with torch.no_grad():
                output = loaded.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                               max_new_tokens=TOKENS, min_new_tokens=TOKENS, do_sample=False,
                                               pad_token_id=loaded.tokenizer.pad_token_id)
            return output[0, len(ids):].tolist()

        def new_sequence(ids: list[int]):
            job = protocol.submit_message(f"cmpl-{uuid.uuid4().hex}", "reply", ModelRef.parse(repo), [ids],
                                          protocol.JobParams(temperature=0, ignore_eos=True, max_tokens=TOKENS))
            return GenerationJob(job, loaded, TemplateSettings(), Handover()).sequences[0]

        def step() -> None:
            runner.execute(DecodePlan(runner.view(), StepClock())).apply()
            runner.drop_finished()

        expected = [generate(ids) for ids in prompts]
        sequences = [new_sequence(ids) for ids in prompts]
        for seq in sequences:  # in chunks of 5, joining one after another
            logits = None
            while logits is None:
                logits = runner.prefill(seq, 5)[1]
            sample_batch(InputBatch([seq]), logits[None]).apply()
            runner.join([seq])
            step()
        while runner.running:
            step()
        checks = {"chunked and joining": [s.completion_ids for s in sequences] == expected}
        if runner.spec.prefills_padded:
            sequences = [new_sequence(ids) for ids in prompts]
            sample_batch(InputBatch(sequences), torch.stack(runner.prefill_together(sequences))).apply()
            runner.join(sequences)
            while runner.running:
                step()
            checks["together"] = [s.completion_ids for s in sequences] == expected
        out["checks"] = checks
        out["status"] = "equal" if all(checks.values()) else "WRONG"
    except Exception as exc:
        out.update(status="error", reason=f"{type(exc).__name__}: {str(exc)[:300]}",
                   where=traceback.format_exc().splitlines()[-3].strip()[:200])
    return out


RECYCLE = 3  # the exit status of a check process that stops to start afresh (its address space has grown)


def check_types(types: list[str], cache: str, timeout_s: float = 120.0) -> list[dict]:
    """Every type checked in processes of this module's own (6 GB of address space each): one process goes
    through the types in turn, so torch and transformers are imported once, and stops for a new one when its
    address space has grown past 4 GB; a type that kills its process or runs over `timeout_s` is an `error`,
    and a type that ran out of memory in a process that had checked others is checked again afresh."""
    results: list[dict] = []
    left = list(types)
    retried: set[str] = set()
    while left:
        process = subprocess.Popen([sys.executable, "-m", "bench.types", cache, *left], cwd=ROOT, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   env={**os.environ, "HF_HUB_CACHE": cache, "HF_HUB_OFFLINE": "1"})
        started, checked = time.monotonic(), 0
        timer = threading.Timer(timeout_s, process.kill)
        timer.start()
        try:
            for line in process.stdout:
                if not line.startswith("RESULT "):
                    continue
                timer.cancel()
                result = json.loads(line[len("RESULT "):])
                checked += 1
                if checked > 1 and "allocate memory" in result.get("reason", "") and result["type"] not in retried:
                    retried.add(result["type"])  # the process's own growth, not the type's: again, afresh
                    process.kill()
                    break
                result["seconds"] = round(time.monotonic() - started, 1)
                results.append(result)
                left.remove(result["type"])
                started = time.monotonic()
                timer = threading.Timer(timeout_s, process.kill)
                timer.start()
        finally:
            timer.cancel()
            code = process.wait()
        if left and code != RECYCLE and left[0] not in retried:
            gone = left.pop(0)  # the type the process was checking when it died or ran out of time
            results.append({"type": gone, "status": "error", "seconds": round(time.monotonic() - started, 1),
                            "reason": f"its check's process ended ({code}) or ran over {timeout_s:.0f} s"})
    return results


def _address_space() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    from workers.tiny.type_matrix import causal_lm_types

    types = QUICK if args.quick else [t for t in args.types.split(",") if t] or causal_lm_types()
    cache = tempfile.mkdtemp(prefix="bench-types-")
    results = check_types(types, cache)
    for result in results:
        if result["status"] != "equal":
            print(f"{result['type']}: {result['status']}: {result.get('reason', result.get('checks'))}", flush=True)
    counts = Counter(r["status"] for r in results)
    print(json.dumps({"types": len(results), **counts}))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"types-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":  # the types named, one after another, in the process check_types started
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
    os.environ["HF_HUB_OFFLINE"] = "1"
    import gc

    import torch

    torch.set_num_threads(1)
    for model_type in sys.argv[2:]:
        print("RESULT " + json.dumps(check_type(model_type, sys.argv[1])), flush=True)
        gc.collect()
        if _address_space() > 4 << 30:
            sys.exit(RECYCLE)
