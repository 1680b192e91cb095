"""Penalties for a batch's rows in tensors kept across steps (vLLM keeps output token counts the same way).

Hugging Face's repetition penalty (over the prompt and the completion), OpenAI's presence and frequency
penalties (over the completion) and a logit bias, each for the rows that ask, as the same float operations
`Sampler.choose` applies to a row alone, in the same order: one `torch.where` and two subtractions over
the rows' [rows, vocab] tensors instead of a bincount of each row's whole history every step. The tensors
are built from the rows' histories at the first step of a batch and then updated with each step's tokens.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from workers.engine.sample.sampling import Sampler


class BatchPenalties:
    """`rows`: positions in the batch's scores; `samplers`: the batch's samplers, by those positions."""

    def __init__(self, samplers: list[Sampler]) -> None:
        self.repeated = [r for r, s in enumerate(samplers) if s.params.repetition_penalty != 1.0]
        self.counted = [r for r, s in enumerate(samplers) if s.params.presence_penalty or s.params.frequency_penalty]
        self.biased = [r for r, s in enumerate(samplers) if s.params.logit_bias]
        self.samplers = samplers
        self.active = bool(self.repeated or self.counted or self.biased)
        self._built = False

    def _build(self, vocab: int, device: torch.device, history: Callable[[int], tuple[list[int], list[int]]]) -> None:
        samplers = self.samplers
        if self.repeated:
            self.seen = torch.zeros((len(self.repeated), vocab + 1), dtype=torch.bool, device=device)
            for k, r in enumerate(self.repeated):
                prompt, completion = history(r)
                ids = torch.tensor(prompt + completion, dtype=torch.long, device=device).clamp(max=vocab)
                self.seen[k, ids] = True  # vocab: a column for ids past the scores (never penalised)
            self.repetition = torch.tensor([[samplers[r].params.repetition_penalty] for r in self.repeated],
                                           device=device)
        if self.counted:
            self.counts = torch.zeros((len(self.counted), vocab), device=device)
            for k, r in enumerate(self.counted):
                completion = history(r)[1]
                if completion:
                    found = torch.bincount(torch.tensor(completion, device=device), minlength=vocab)[:vocab]
                    self.counts[k] = found.to(self.counts.dtype)
            self.frequency = torch.tensor([[samplers[r].params.frequency_penalty] for r in self.counted], device=device)
            self.presence = torch.tensor([[samplers[r].params.presence_penalty] for r in self.counted], device=device)
        if self.biased:
            self.bias = torch.zeros((len(self.biased), vocab), device=device)
            for k, r in enumerate(self.biased):
                bias = samplers[r].params.logit_bias
                self.bias[k, torch.tensor(list(bias), device=device)] = torch.tensor(list(bias.values()), device=device)
        self._built = True

    def apply(self, scores: torch.Tensor, history: Callable[[int], tuple[list[int], list[int]]]) -> None:
        """Penalise `scores` ([batch rows, vocab], float32) in place; `history(r)` (prompt ids, completion ids)
        of the batch's row r is read at the first step only."""
        if not self._built:
            self._build(scores.shape[-1], scores.device, history)
        if self.repeated:
            part = scores[self.repeated]
            penalised = torch.where(part < 0, part * self.repetition, part / self.repetition)
            scores[self.repeated] = torch.where(self.seen[:, :-1], penalised, part)
        if self.counted:
            part = scores[self.counted]
            part -= self.frequency * self.counts + self.presence * (self.counts > 0).to(part.dtype)
            scores[self.counted] = part
        if self.biased:
            scores[self.biased] = scores[self.biased] + self.bias

    def took(self, tokens: torch.Tensor) -> None:
        """Each row's token of this step ([batch rows]) joins its history."""
        if not self._built:
            return
        if self.repeated:
            self.seen[torch.arange(len(self.repeated), device=tokens.device), tokens[self.repeated].clamp(
                max=self.seen.shape[1] - 1)] = True
        if self.counted:
            self.counts[torch.arange(len(self.counted), device=tokens.device), tokens[self.counted]] += 1

    def took_more(self, r: int, tokens: list[int]) -> None:
        """Row r's further tokens of this step (a verified run of drafts) join its history."""
        if not self._built or not tokens:
            return
        if r in self.repeated:
            ids = torch.tensor(tokens, dtype=torch.long, device=self.seen.device)
            self.seen[self.repeated.index(r), ids.clamp(max=self.seen.shape[1] - 1)] = True
        if r in self.counted:
            row = self.counts[self.counted.index(r)]
            ids = torch.tensor(tokens, dtype=torch.long, device=row.device)
            row.index_put_((ids,), torch.ones(len(tokens), device=row.device), accumulate=True)
