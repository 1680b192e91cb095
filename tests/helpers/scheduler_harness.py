"""A real runner and the scheduler that drives it on one tiny model, stepped by hand (no engine thread)."""
from __future__ import annotations

import uuid

import pytest
import torch


class Harness:
    """A real runner with a prefix cache, and the scheduler that drives it, on one tiny model."""

    def __init__(self, cache, family: str, **settings) -> None:
        from huggingface_hub import constants

        import protocol
        from workers.engine.config import EngineConfig
        from workers.engine.core.metrics import EngineMetrics
        from workers.engine.core.scheduler import Scheduler
        from workers.engine.execution.kv.budget import KVBudgetSetting
        from workers.engine.execution.runner import ModelRunner, RunnerSettings
        from workers.engine.models.model_loader import load_model

        from ..conftest import Reference

        self.model = f"local/tiny-{family}"
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(constants, "HF_HUB_CACHE", str(cache))
            self.loaded = load_model(protocol.ModelRef.parse(self.model), device="cpu", dtype="float32")
        self.reference = Reference(cache, self.model)
        if "kv_cache_bytes" in settings:  # the server's --kv-cache-memory
            settings["kv_budget"] = KVBudgetSetting(server_bytes=settings.pop("kv_cache_bytes"))
        self.runner = ModelRunner(self.loaded, RunnerSettings(**{"prefill_chunk": 256, "max_rows": 8,
                                                                 "prefix_cache_bytes": 64 * 1024 * 1024, **settings}))
        self.scheduler = Scheduler({self.model: self.runner}, EngineMetrics(),
                                   EngineConfig(max_num_seqs=self.runner.batch.first_row_slots, prefill_chunk=256, device="cpu"))

    def sequence(self, ids: list[int], tokens: int):
        import protocol
        from workers.engine.config import TemplateSettings
        from workers.engine.inputs.generation_job import GenerationJob
        from workers.engine.sequences import Handover

        job = protocol.submit_message(f"cmpl-{uuid.uuid4().hex}", "reply", protocol.ModelRef.parse(self.model), [ids],
                                      protocol.JobParams(temperature=0, ignore_eos=True, max_tokens=tokens))
        request = GenerationJob(job, self.loaded, TemplateSettings(), Handover())
        request.model_name = request.served_name = self.model
        return request.sequences[0]

    def prefill(self, ids: list[int]) -> tuple[int, torch.Tensor]:
        """The runner's own prefill of a prompt (from the prefix cache where it can): (tokens reused, last logits)."""
        seq = self.sequence(ids, 1)
        self.runner.attach_prefix(seq)
        _, logits = self.runner.prefill(seq, len(ids))
        self.runner.remember_prefix(seq)
        return seq.cached_prompt_tokens, logits

    def generate(self, ids: list[int], tokens: int = 6):
        """The prompt through the scheduler's steps: the finished sequence."""
        seq = self.sequence(ids, tokens)
        self.scheduler.enqueue([seq])
        for _ in range(4 * tokens):
            if seq.finished:
                break
            self.scheduler.admit()
            self.scheduler.prefill(self.scheduler.decoding(), first=True)
            self.scheduler.decode()
            self.scheduler.prefill(True)
        return seq

    def run_together(self, prompts: list[list[int]], tokens: int, after_step=None, steps: int = 2000) -> list:
        """The prompts through the scheduler's steps at once (`after_step()` after each): the finished sequences."""
        sequences = [self.sequence(ids, tokens) for ids in prompts]
        self.scheduler.enqueue(sequences)
        for _ in range(steps):
            if all(seq.finished for seq in sequences):
                break
            self.scheduler.admit()
            self.scheduler.prefill(self.scheduler.decoding(), first=True)
            self.scheduler.decode()
            self.scheduler.prefill(True)
            if after_step is not None:
                after_step()
        return sequences
