"""One choice as the engine thread holds it: its tokens, its sampler, its KV state, its place in the line.

The decode state alone: what the scheduler, the runner and the sampler read or write each step. What the
client sees of it (text, stop strings, logprobs' texts, parsed parts) is its `output`
(workers/engine/output/choice_output.py), written on the output thread from the token ids each step
hands over (`Handover`). Every layer of the engine reads a Sequence, so it sits at the package's root.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only for annotations: a Sequence's request is an inputs.generation_job.GenerationJob
    import torch

    from workers.engine.output.choice_output import ChoiceOutput
    from workers.engine.sample.constraints import Constraint
    from workers.engine.sample.sampling import Sampler, TokenChoice

logger = logging.getLogger(__name__)

# One hand-over entry: (sequence, token id or None, its logprob, its top alternatives, why it ended or None).
Entry = tuple["Sequence", "int | None", "float | None", list, "str | None"]


class Handover:
    """What a step decided, for the output thread: one entry per token taken and per choice ended, in order."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []

    def take(self) -> list[Entry]:
        entries, self.entries = self.entries, []
        return entries


class Sequence:
    """One choice being generated (the engine thread's alone)."""

    __slots__ = ("request", "index", "prompt_index", "prefilled", "prompt_ids", "sampler", "max_tokens",
                 "end_ids", "eos_ids", "completion_ids", "state", "media_inputs", "finish_reason", "constraint",
                 "paused", "wants_prompt_logprobs", "prompt_scorer", "echo_scoring", "output", "handover",
                 "wants_logprobs", "speculation", "cached_prompt_tokens", "checkpoint_at", "recomputes", "rope_table", "rope_offset", "__weakref__")

    def __init__(self, request: Any, index: int, prompt_index: int, prompt_ids: list[int], sampler: "Sampler",
                 max_tokens: int, output: "ChoiceOutput", handover: Handover, prompt_scorer=None,
                 echo_scoring: bool = False) -> None:
        self.request = request
        self.index = index
        self.prompt_index = prompt_index  # choices of one prompt share its prefill
        self.prefilled = 0
        self.cached_prompt_tokens = 0  # prompt tokens its prefill took from the prefix cache (usage's cached_tokens)
        self.checkpoint_at = 0  # a recurrent model's prefill keeps its states at this prompt position (0: nowhere)
        self.recomputes = False  # preempted, its cache dropped: it prefills its prompt and what it drew again
        self.prompt_ids = prompt_ids
        self.sampler = sampler
        self.max_tokens = max_tokens
        params = request.params
        self.eos_ids = frozenset(() if sampler.params.ignore_eos else sampler.eos_token_ids)
        self.end_ids = self.eos_ids | frozenset(params.stop_token_ids)  # tokens that end the choice
        self.completion_ids: list[int] = []
        self.state = None  # the runner's per-sequence model state (KV cache) while out of the batch
        self.media_inputs: dict | None = None  # processor tensors the prompt's prefill takes (pixel_values, …)
        # M-RoPE (workers/engine/execution/mrope.py): the prompt's (3, length) rotary positions while it prefills,
        # and the offset every later token's rotary position has from its index
        self.rope_table: torch.Tensor | None = None
        self.rope_offset = 0
        self.finish_reason: str | None = None
        self.constraint: Constraint | None = None  # set once the request's grammar is compiled
        self.paused = False  # preempted: out of the batch with its keys/values in `state`, waiting to rejoin
        self.prompt_scorer = prompt_scorer  # echo + logprobs / prompt_logprobs: the prompt scored as it prefills
        self.echo_scoring = echo_scoring
        self.wants_prompt_logprobs = prompt_scorer is not None
        self.wants_logprobs = sampler.params.logprobs is not None
        self.output = output  # the output thread's (after the first hand-over)
        self.handover = handover  # where this choice's tokens go for the output thread
        self.speculation = None  # its proposer state (workers/engine/speculation/rows.py); False: it never proposes

    @property
    def prefill_ids(self) -> list[int]:
        """What its prefill feeds: the prompt, or after a preemption that dropped its cache (`recomputes`) the
        prompt and every token drawn but the last (which the next decode step feeds)."""
        return self.prompt_ids + self.completion_ids[:-1] if self.recomputes else self.prompt_ids

    # Who the scheduler serves it for (workers/engine/core/fair_share.py).
    @property
    def team(self) -> str:
        return self.request.team

    @property
    def share(self) -> float:
        return self.request.share

    @property
    def priority_class(self) -> str:
        return self.request.priority_class

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def record_prompt_chunk(self, chunk_logits, last: bool) -> None:
        """Echo + logprobs: score the prompt tokens this prefill chunk settles; all go out with the first token."""
        output = self.output
        self.prompt_scorer.score_chunk(chunk_logits, output.prompt_logprobs.add)
        if last:
            wanted = self.request.params.prompt_logprobs
            output.prompt_scored(self.prompt_scorer.by_id(wanted) if wanted is not None else None, self.echo_scoring)

    def abort(self) -> None:
        """The client is gone: stop without producing anything more."""
        self.finish_reason = "cancelled"
        self.state = None

    def accept(self, choice: "TokenChoice | None") -> None:
        """Take a sampled choice (None: the grammar allowed no token)."""
        if choice is None:
            self.take(None)
        else:
            self.take(choice.token_id, choice.logprob, choice.top)

    def take(self, token_id: int | None, logprob: float | None = None, top=()) -> None:
        """Take the sampled token and decide whether the choice ends with it (EOS, a stop token, the grammar,
        max_tokens); stop strings are the output thread's to find."""
        if token_id is None:
            self.dead_end("no token allowed")
            return
        self.completion_ids.append(token_id)
        self.handover.entries.append((self, token_id, logprob, top, None))
        constraint = self.constraint
        if constraint is not None and token_id not in self.eos_ids and not constraint.consume(token_id):
            self.dead_end(constraint.error or "token refused")
        elif token_id in self.end_ids or (constraint is not None and constraint.complete):
            self.finish("stop")
        elif len(self.completion_ids) >= self.max_tokens:
            self.finish("length")

    def dead_end(self, reason: str) -> None:
        """The grammar admits no token: end this choice as complete ("stop"), not the request."""
        logger.warning("%s choice %d: grammar dead end after %d tokens (%s); finishing it", self.request.request_id,
                       self.index, len(self.completion_ids), reason)
        self.finish("stop")

    def finish(self, reason: str) -> None:
        """End the choice (the output thread hears of it in order with its tokens)."""
        if self.finish_reason is not None:
            return
        self.finish_reason = reason
        self.state = None
        self.handover.entries.append((self, None, None, None, reason))

    def stopped_by_text(self) -> None:
        """The output thread found a stop string: the choice ends here (nothing more goes out for it)."""
        if self.finish_reason is None:
            self.finish_reason = "stop"
            self.state = None
