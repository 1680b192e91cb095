"""The physical limit on this machine: `model.generate` in-process, no HTTP, no channel layer."""
from __future__ import annotations

import gc
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


class RawEngine:
    """The model loaded in the benchmark's own process, measured a figure at a time."""

    def __init__(self, model_id: str, prompts: list[str], device: str = "cpu", dtype: str = "auto") -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(model_id, local_files_only=True)
        self.tokenizer.padding_side = "left"
        torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
        self.model = AutoModelForCausalLM.from_pretrained(model_id, local_files_only=True, dtype=torch_dtype).eval()
        self.model.to(device)
        self.device = device
        self.prompts = prompts
        self.single = self.tokenizer(prompts[:1], return_tensors="pt").to(device)
        self.batch = self.tokenizer(prompts, return_tensors="pt", padding=True).to(device)
        with torch.no_grad():
            self.model.generate(**self.single, max_new_tokens=4, do_sample=False)  # warm-up

    def prefill_ms(self) -> float:
        """Prefill of one prompt: p50 of 5 forwards."""
        times = []
        with torch.no_grad():
            for _ in range(5):
                started = time.perf_counter()
                self.model(**self.single)
                times.append(time.perf_counter() - started)
        return round(statistics.median(times) * 1000, 1)

    def single_tokens_per_s(self, max_new_tokens: int) -> float:
        return round(max_new_tokens / self._generate(self.single, max_new_tokens), 1)

    def batch_tokens_per_s(self, max_new_tokens: int) -> float:
        return round(self.batch_size * max_new_tokens / self._generate(self.batch, max_new_tokens), 1)

    def padded_tokens_per_s(self, count: int, max_new_tokens: int) -> dict:
        """The first `count` prompts as one left-padded batch: tok/s, seconds and ms per decode step."""
        inputs = self.tokenizer(self.prompts[:count], return_tensors="pt", padding=True).to(self.device)
        seconds = self._generate(inputs, max_new_tokens)
        return {"tokens": count * max_new_tokens, "seconds": round(seconds, 3),
                "tokens_per_s": round(count * max_new_tokens / seconds, 1),
                "step_ms": round(seconds / max_new_tokens * 1000, 2),
                "prompt_len_padded": int(inputs["input_ids"].shape[1])}

    @property
    def batch_size(self) -> int:
        return int(self.batch["input_ids"].shape[0])

    def _generate(self, inputs, max_new_tokens: int) -> float:
        """Seconds for greedy generation of exactly max_new_tokens (EOS ignored)."""
        with torch.no_grad():
            self._sync()
            started = time.perf_counter()
            self.model.generate(**inputs, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False)
            self._sync()
            return time.perf_counter() - started

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def close(self) -> None:
        del self.model
        gc.collect()

