"""The physical limit on this machine: `model.generate` in-process, no HTTP, no channel layer."""
from __future__ import annotations

import gc
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


class RawEngine:
    """The model loaded in the benchmark's own process; `measure()` is one round of raw figures."""

    def __init__(self, model_id: str, prompts: list[str]) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(model_id, local_files_only=True)
        self.tokenizer.padding_side = "left"
        self.model = AutoModelForCausalLM.from_pretrained(model_id, local_files_only=True).eval()
        self.single = self.tokenizer(prompts[:1], return_tensors="pt")
        self.batch = self.tokenizer(prompts, return_tensors="pt", padding=True)
        with torch.no_grad():
            self.model.generate(**self.single, max_new_tokens=4, do_sample=False)  # warm-up

    def measure(self, max_new_tokens: int) -> dict:
        """Prefill of one prompt (p50 of 5), one sequence, and the padded batch, greedy, EOS ignored."""
        options = {"max_new_tokens": max_new_tokens, "min_new_tokens": max_new_tokens, "do_sample": False}
        with torch.no_grad():
            prefill_times = []
            for _ in range(5):
                started = time.perf_counter()
                self.model(**self.single)
                prefill_times.append(time.perf_counter() - started)
            single = _timed(lambda: self.model.generate(**self.single, **options))
            batch = _timed(lambda: self.model.generate(**self.batch, **options))
        rows = int(self.batch["input_ids"].shape[0])
        return {
            "prefill_ms_p50": round(statistics.median(prefill_times) * 1000, 1),
            "single_tokens_per_s": round(max_new_tokens / single, 1),
            "batch_size": rows,
            "batch_tokens_per_s": round(rows * max_new_tokens / batch, 1),
        }

    def close(self) -> None:
        del self.model
        gc.collect()


def _timed(run) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started
