"""The step contract between the scheduler and a model's runner: a plan in, the step's output back.

As vLLM V1 cuts it (SchedulerOutput -> ModelRunnerOutput): the scheduler decides which prompts prefill
and how many of their tokens (`PrefillWork`), and which rows decode (`DecodePlan`); the runner executes
exactly that over the cache and returns only what came of it (completed prompts' logits; each row's
token id, logprobs where asked); the scheduler applies it to the sequences. The runner never decides
membership or budgets, and the scheduler never touches a tensor.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    import torch

    from workers.engine.execution.input_batch import InputBatch
    from workers.engine.sequences import Sequence
    from workers.engine.sample.sampling import TokenChoice
    from workers.engine.step_clock import StepClock


@dataclass(frozen=True)
class PrefillWork:
    """Prompt tokens for one forward of one model: the next `tokens` of one prompt (alone: a chunk, a prompt
    that must be scored at every position, one with media), or the whole rests of several prompts in one
    left-padded forward (`together`)."""

    rows: "tuple[Sequence, ...]"
    tokens: int  # prompt tokens this forward feeds
    together: bool = False


@dataclass
class PrefillOutput:
    """The prompts a PrefillWork completed, each with its next-token logits (a chunk that leaves the prompt
    unfinished completes none)."""

    done: "list[tuple[Sequence, torch.Tensor]]" = field(default_factory=list)


@dataclass(frozen=True)
class DecodePlan:
    """One model's decode step: every row of `rows` (the persistent batch, in its order) takes one token."""

    rows: "InputBatch"
    clock: "StepClock | None" = None  # where the step's time goes (prepare, forward, sample)
    waiting: bool = False  # sequences wait for their prefill: a longer step delays them too (speculation)


@dataclass
class StepOutput:
    """What a decode step chose, by row of its plan: token ids (None: the grammar allowed none), the
    model's logprobs for rows that asked (row -> (logprob, top)), and the rows sampled one by one with
    their whole choice; a step that verified drafts adds each proposing row's accepted run after its first
    token (`extra`: row -> [(id, logprob, top)], workers/engine/speculation/verify.py)."""

    rows: "InputBatch"
    token_ids: list[int | None]
    logprobs: dict[int, tuple[float, list]] = field(default_factory=dict)
    alone: dict[int, "TokenChoice | None"] = field(default_factory=dict)
    extra: dict[int, list[tuple[int, float | None, list]]] = field(default_factory=dict)

    def apply(self) -> None:
        """Each row takes its token (Sequence.take: an append and the end checks, no tensor work), then its
        accepted run token by token until one ends the choice (EOS, a stop id, max_tokens): the tokens after
        that are never handed over."""
        rows = self.rows.rows
        if not self.logprobs and not self.alone:
            for seq, token_id in zip(rows, self.token_ids):
                seq.take(token_id)
        else:
            for i, (seq, token_id) in enumerate(zip(rows, self.token_ids)):
                if i in self.alone:
                    seq.accept(self.alone[i])
                else:
                    logprob, top = self.logprobs.get(i, (None, ()))
                    seq.take(token_id, logprob, top)
        for i, run in self.extra.items():
            seq = rows[i]
            for token_id, logprob, top in run:
                if seq.finished:
                    break
                seq.take(token_id, logprob, top)
