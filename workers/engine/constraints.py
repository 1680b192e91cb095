"""Per-choice grammar state and the batch's token masks for one decode step.

Every constrained row of the step gets one row of a single int32 bitmask, filled by
llguidance in parallel, unpacked once into a boolean [rows, vocab] tensor; the sampler
applies each row to that choice's scores. Unconstrained rows take no part (no mask, no cost).
"""
from __future__ import annotations

import logging

from typing import TYPE_CHECKING

import llguidance
import torch

if TYPE_CHECKING:
    from workers.engine.sequences import Sequence

logger = logging.getLogger(__name__)

_EXECUTOR = llguidance.LLExecutor()
_BIT_SHIFTS = torch.arange(32, dtype=torch.int32)


class Constraint:
    """One choice's position in its grammar."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self.matcher = matcher

    def consume(self, token_id: int) -> bool:
        """Advance by the sampled token; False when the grammar cannot take it (a dead end)."""
        return bool(self.matcher.consume_token(token_id)) and not self.matcher.is_error()

    @property
    def complete(self) -> bool:
        """The grammar admits nothing more: the choice is finished."""
        return self.matcher.is_stopped()

    @property
    def error(self) -> str:
        return self.matcher.get_error() if self.matcher.is_error() else ""


def allowed_tokens(constraints: list[Constraint], vocab_size: int) -> torch.Tensor:
    """[len(constraints), vocab_size] booleans: which tokens each grammar allows next."""
    words = (vocab_size + 31) // 32
    bitmask = torch.zeros((len(constraints), words), dtype=torch.int32)
    _EXECUTOR.unsafe_compute_mask_ptr([(c.matcher, row) for row, c in enumerate(constraints)],
                                      bitmask.data_ptr(), words * 4, len(constraints))
    bits = (bitmask.unsqueeze(-1) >> _BIT_SHIFTS) & 1
    return bits.reshape(len(constraints), words * 32)[:, :vocab_size].bool()


def masks_for(constraints: list[Constraint | None], vocab_size: int) -> list[torch.Tensor | None]:
    """One allowed-token row per entry (None where unconstrained), computed together."""
    rows = [i for i, c in enumerate(constraints) if c is not None]
    masks: list[torch.Tensor | None] = [None] * len(constraints)
    if rows:
        allowed = allowed_tokens([constraints[i] for i in rows], vocab_size)
        for position, row in enumerate(rows):
            masks[row] = allowed[position]
    return masks


def sample_rows(pairs: list[tuple["Sequence", torch.Tensor]]) -> None:
    """Each row takes its next token; the constrained rows' grammar masks are filled together first."""
    if not pairs:
        return
    masks = masks_for([seq.constraint for seq, _ in pairs], pairs[0][1].shape[-1])
    for (seq, logits), allowed in zip(pairs, masks):
        seq.accept(seq.sampler.choose(logits, seq.prompt_ids, seq.completion_ids, allowed))
