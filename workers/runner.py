"""The model's forward pass for the engine: one call gives each sequence its next-token logits."""
from __future__ import annotations

import torch
from transformers import DynamicCache

from .model_loader import LoadedModel
from .sequences import Sequence


class ModelRunner:
    """Runs prefill for new sequences and one decode step for the others.

    Each sequence keeps its own KV cache, so a sequence joins or leaves at any
    step and its greedy output is exactly what `model.generate` gives.
    """

    def step(self, loaded: LoadedModel, sequences: list[Sequence]) -> list[torch.Tensor]:
        return [self._forward(loaded, seq) for seq in sequences]

    def _forward(self, loaded: LoadedModel, seq: Sequence) -> torch.Tensor:
        model = loaded.model
        prefill = seq.state is None
        if prefill:
            seq.state = DynamicCache(config=model.config)
            input_ids = seq.prompt_ids
        else:
            input_ids = seq.completion_ids[-1:]
        keep_all = prefill and seq.wants_prompt_logprobs
        output = model(
            input_ids=torch.tensor([input_ids], device=loaded.device),
            past_key_values=seq.state,
            use_cache=True,
            logits_to_keep=0 if keep_all else 1,
        )
        seq.state = output.past_key_values
        logits = output.logits[0]
        if keep_all:
            seq.record_prompt_logprobs(logits[:-1])
        return logits[-1]

    def prompt_logits(self, loaded: LoadedModel, seq: Sequence) -> torch.Tensor:
        """Logits over the whole prompt, for echo + logprobs with nothing to generate."""
        output = loaded.model(input_ids=torch.tensor([seq.prompt_ids], device=loaded.device), use_cache=False)
        return output.logits[0]
