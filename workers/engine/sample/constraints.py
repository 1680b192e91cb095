"""Per-choice grammar state and the batch's token masks for one decode step.

Every constrained row of the step gets one row of a single int32 bitmask, filled by
llguidance in parallel, unpacked once into a boolean [rows, vocab] tensor; the sampler
applies each row to that choice's scores. Unconstrained rows take no part (no mask, no cost).
"""
from __future__ import annotations

import logging

import llguidance
import torch

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
