"""Where a step's time goes: seconds per phase, summed (plain floats: a few additions per step).

The phases of vLLM's step as this engine runs them: `schedule` (rows in and out, who prefills),
`prefill` (prompt forwards and their first tokens), `propose` (speculative decoding's drafts: an n-gram
lookup or a draft model's forwards), `prepare` (the decode step's inputs), `forward`
(the model), `sample` (the batch's tokens and each row's end checks), `hand_over` (the step's ids to
the output thread), `tasks` (embeddings, scores, transcriptions). The engine publishes the sums as
`inference_step_phase_seconds{phase}`; `bench --scenario engine` prints the split.
"""
from __future__ import annotations

import time

PHASES = ("schedule", "prefill", "propose", "prepare", "forward", "sample", "hand_over", "tasks")


class StepClock:
    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.steps = 0
        self._mark = time.perf_counter()

    def start(self) -> None:
        """A step begins: the next `lap` counts from now."""
        self._mark = time.perf_counter()

    def lap(self, phase: str) -> None:
        """The time since the last mark was spent on `phase`."""
        now = time.perf_counter()
        self.seconds[phase] += now - self._mark
        self._mark = now

    def snapshot(self) -> dict[str, float]:
        return {**self.seconds, "steps": self.steps}
