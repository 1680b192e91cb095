"""Which rows speculate, what they propose, and when to stop: per row, the adaptive part.

A row proposes only where verifying cannot change its output: greedy, sampled in the batch (no penalties,
logit bias or grammar, which read the history token by token). Sampled rows decode without speculation
(rejection sampling is not built yet). A row whose drafts keep being rejected stops proposing for a while,
doubling each time (so chat with no overlap pays for a few wasted verifications, then nothing), as vLLM's
and SGLang's adaptive speculation back off.
"""
from __future__ import annotations

import numpy

from workers.engine.speculation.config import SpeculativeConfig
from workers.engine.speculation.ngram import lookup

LOW_ACCEPTANCE = 0.25  # below this recent acceptance rate a row backs off
FIRST_BACKOFF = 8  # steps without proposing after the first back-off; doubles up to MAX_BACKOFF
MAX_BACKOFF = 256
DECAY = 0.6  # weight of the past in the recent acceptance rate


class RowSpeculation:
    """One row's proposer state: its prompt as an array (kept), its recent acceptance, its back-off."""

    __slots__ = ("prompt", "rate", "quiet", "backoff")

    def __init__(self, prompt_ids: list[int]) -> None:
        self.prompt = numpy.asarray(prompt_ids, dtype=numpy.int64)
        self.rate = 1.0
        self.quiet = 0  # steps left without proposing
        self.backoff = FIRST_BACKOFF

    def verified(self, proposed: int, accepted: int) -> None:
        self.rate = DECAY * self.rate + (1 - DECAY) * accepted / proposed
        if self.rate < LOW_ACCEPTANCE:
            self.quiet, self.backoff = self.backoff, min(MAX_BACKOFF, self.backoff * 2)
            self.rate = LOW_ACCEPTANCE * 2  # a fresh start after the pause
        elif accepted == proposed:
            self.backoff = FIRST_BACKOFF


def may_speculate(seq) -> bool:
    """Whether verifying drafts leaves this row's output exactly as decoding one token a step would."""
    sampler = seq.sampler
    params = sampler.params
    return (params.greedy and sampler.batchable and seq.constraint is None and params.repetition_penalty == 1.0
            and not params.presence_penalty and not params.frequency_penalty and not params.logit_bias)


class NgramProposer:
    """Drafts for a batch's rows, and the counts `/metrics` reports."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        self.drafts = self.draft_tokens = self.accepted = 0  # since the metrics last took them

    def propose(self, rows: list) -> dict[int, list[int]]:
        """{row: drafts} for the rows that propose this step (rows absent decode one token)."""
        config = self.config
        proposals: dict[int, list[int]] = {}
        for i, seq in enumerate(rows):
            state = seq.speculation
            if state is None:
                if not may_speculate(seq):
                    seq.speculation = False
                    continue
                state = seq.speculation = RowSpeculation(seq.prompt_ids)
            elif state is False:
                continue
            if state.quiet:
                state.quiet -= 1
                continue
            room = seq.max_tokens - len(seq.completion_ids) - 1  # tokens past max_tokens would never go out
            if room < 1:
                continue
            completion = seq.completion_ids
            tokens = numpy.concatenate([state.prompt, numpy.asarray(completion, dtype=numpy.int64)])
            drafts = lookup(tokens, config.prompt_lookup_min, config.prompt_lookup_max,
                            min(room, config.num_speculative_tokens))
            if drafts:
                proposals[i] = drafts
        return proposals

    def verified(self, rows: list, proposals: dict[int, list[int]], kept: list[int]) -> None:
        """Each proposing row's acceptance (kept[i] - 1 of its drafts), for its back-off and the counts."""
        for i, drafts in proposals.items():
            accepted = kept[i] - 1
            rows[i].speculation.verified(len(drafts), accepted)
            self.drafts += 1
            self.draft_tokens += len(drafts)
            self.accepted += accepted

    def take_counts(self) -> tuple[int, int, int]:
        """(drafts, draft tokens, accepted tokens) since the last call."""
        counts = (self.drafts, self.draft_tokens, self.accepted)
        self.drafts = self.draft_tokens = self.accepted = 0
        return counts
