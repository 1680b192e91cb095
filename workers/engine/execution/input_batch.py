"""The persistent batch: what a step needs of its running rows, kept by row and rebuilt only on a change.

vLLM's InputBatch keeps every running request's state in preallocated columns and updates them by
diffs as requests join and leave, so a step never walks Python objects per row. At our size the
same idea is a view a runner keeps of its rows: built once when rows join, pause or leave (the
runner calls `changed()`), read by every step until then: the rows in batch order, their sampling
columns (workers/engine/sample/batch_sampling.py), which rows carry a grammar, and how many rows
each team holds (fair share charges a step per team, not per row).
"""
from __future__ import annotations

from collections import Counter

import torch

from workers.engine.sample.batch_sampling import SamplingColumns
from workers.engine.sequences import Sequence


class InputBatch:
    """One runner's running rows, in the order of the logits its decode step returns."""

    def __init__(self, rows: list[Sequence], device: torch.device | None = None) -> None:
        self.rows = rows
        self.sampling = SamplingColumns([seq.sampler for seq in rows], device)
        self.constrained = [i for i, seq in enumerate(rows) if seq.constraint is not None]
        self.no_masks: list[torch.Tensor | None] = [None] * len(rows)
        teams: Counter = Counter()
        shares: dict[str, float] = {}
        for seq in rows:
            teams[seq.team] += 1
            shares.setdefault(seq.team, seq.share)
        self.teams = [(team, count, shares[team]) for team, count in teams.items()]  # (team, rows, share)

    def __len__(self) -> int:
        return len(self.rows)

    def generated(self) -> list[int] | None:
        """Each row's completion length, where sampling needs it this step (EOS held off before min_tokens)."""
        return [len(seq.completion_ids) for seq in self.rows] if self.sampling.eos_until else None

    def history(self, row: int) -> tuple[list[int], list[int]]:
        seq = self.rows[row]
        return seq.prompt_ids, seq.completion_ids
