"""The step contract between the scheduler and a model's runner: a plan in, the step's output back.

As vLLM V1 cuts it (SchedulerOutput -> ModelRunnerOutput): the scheduler decides which rows run and
what each needs; the runner executes exactly that over the cache and returns only what was chosen
(token ids, logprobs where asked); the scheduler applies it to the sequences. The runner never decides
membership and the scheduler never touches a tensor.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    from workers.engine.execution.input_batch import InputBatch
    from workers.engine.sample.sampling import TokenChoice
    from workers.engine.step_clock import StepClock


@dataclass(frozen=True)
class DecodePlan:
    """One model's decode step: every row of `rows` (the persistent batch, in its order) takes one token."""

    rows: "InputBatch"
    clock: "StepClock | None" = None  # where the step's time goes (prepare, forward, sample)


@dataclass
class StepOutput:
    """What a decode step chose, by row of its plan: token ids (None: the grammar allowed none), the
    model's logprobs for rows that asked (row -> (logprob, top)), and the rows sampled one by one with
    their whole choice."""

    rows: "InputBatch"
    token_ids: list[int | None]
    logprobs: dict[int, tuple[float, list]] = field(default_factory=dict)
    alone: dict[int, "TokenChoice | None"] = field(default_factory=dict)

    def apply(self) -> None:
        """Each row takes its token (Sequence.take: an append and the end checks, no tensor work)."""
        rows = self.rows.rows
        if not self.logprobs and not self.alone:
            for seq, token_id in zip(rows, self.token_ids):
                seq.take(token_id)
            return
        for i, (seq, token_id) in enumerate(zip(rows, self.token_ids)):
            if i in self.alone:
                seq.accept(self.alone[i])
            else:
                logprob, top = self.logprobs.get(i, (None, ()))
                seq.take(token_id, logprob, top)
