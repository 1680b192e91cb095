"""The physical limit on this machine: `model.generate` in-process, no HTTP, no channel layer."""
from __future__ import annotations

import gc
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def _median_rate(tokens: int, run, repeats: int) -> tuple[float, list[float]]:
    """Tokens per second of `run()`: the median of `repeats` runs, and every run's figure."""
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        rates.append(round(tokens / (time.perf_counter() - started), 1))
    return statistics.median(rates), rates


def measure_raw(model_id: str, prompts: list[str], max_new_tokens: int, repeats: int = 1) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(model_id, local_files_only=True)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_id, local_files_only=True).eval()
    figures = {}
    with torch.no_grad():
        single = tokenizer(prompts[:1], return_tensors="pt")
        model.generate(**single, max_new_tokens=4, do_sample=False)  # warm-up
        prefill_times = []
        for _ in range(5):
            started = time.perf_counter()
            model(**single)
            prefill_times.append(time.perf_counter() - started)
        figures["prefill_ms_p50"] = round(statistics.median(prefill_times) * 1000, 1)
        options = {"max_new_tokens": max_new_tokens, "min_new_tokens": max_new_tokens, "do_sample": False}
        figures["single_tokens_per_s"], figures["single_runs"] = _median_rate(
            max_new_tokens, lambda: model.generate(**single, **options), repeats)
        batch = tokenizer(prompts, return_tensors="pt", padding=True)
        figures["batch_size"] = len(prompts)
        figures["batch_tokens_per_s"], figures["batch_runs"] = _median_rate(
            len(prompts) * max_new_tokens, lambda: model.generate(**batch, **options), repeats)
    del model
    gc.collect()
    return figures
