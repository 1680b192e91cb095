"""Which rows speculate, what they propose, and when to stop: per row, the adaptive part.

A row proposes only where verifying cannot change its output (greedy) or its output's distribution (sampled):
any row picked in the batch's sampling columns, penalised, biased and grammar-constrained rows included (at
each draft position verification applies the penalties of the history with the drafts before it and the
grammar's mask after them: verify.py); rows sampled one by one (n-gram bans, bad words, an allowed-token set,
typical-p), LoRA rows and models whose caches cannot drop drafts (proposers.py) decode one token a step. A
row whose drafts keep being rejected stops proposing for a while,
doubling each time (so chat with no overlap pays for a few wasted verifications, then nothing), as vLLM's
and SGLang's adaptive speculation back off.
"""
from __future__ import annotations

import numpy

from protocol.speculative import SpeculativeConfig
from workers.engine.speculation.ngram import lookup
from workers.engine.speculation.step_cost import StepCost

LOW_ACCEPTANCE = 0.25  # below this recent acceptance rate a row backs off
FIRST_BACKOFF = 8  # steps without proposing after the first back-off; doubles up to MAX_BACKOFF
MAX_BACKOFF = 256
DECAY = 0.7  # weight of the past in a row's recent counts of drafts kept and tried
MOST_LIKELY = 0.9  # the highest chance a draft is kept that the width choice assumes
# A width must promise this many times the tokens per second of a one-token step: the expectation runs ahead
# of what rows keep (16 mixed rows on CPU: 20.5 drafts expected per step, 17.5 kept), and rows that finish
# sooner leave a smaller batch behind, which decodes less per second; a step that barely pays is not taken.
MARGIN = 1.15
# A verifying step may slow the rows that propose nothing by at most this much (its time over a one-token
# step's): they gain nothing from it. On a GPU its extra columns cost next to nothing; on CPU they cost their
# share, and a team whose rows chat should not wait 1.5x longer for another's rows to quote (fair share).
SPARED_SLOWDOWN = 1.1


class RowSpeculation:
    """One row's proposer state: its prompt as an array (kept), its recent chance that a draft is kept (given
    the one before it was: drafts are kept up to the first miss, so a verification of d drafts that kept a
    is a kept-and-tried count of (a, a + 1), or (d, d) when every draft was kept), its back-off."""

    __slots__ = ("prompt", "kept", "tried", "quiet", "backoff")

    def __init__(self, prompt_ids: list[int]) -> None:
        self.prompt = numpy.asarray(prompt_ids, dtype=numpy.int64)
        self.kept, self.tried = MOST_LIKELY, 1.0  # decayed counts; a first guess that drafts are good
        self.quiet = 0  # steps left without proposing
        self.backoff = FIRST_BACKOFF

    @property
    def rate(self) -> float:
        """The recent chance that a draft is kept."""
        return self.kept / self.tried

    def verified(self, proposed: int, accepted: int) -> None:
        self.kept = DECAY * self.kept + accepted
        self.tried = DECAY * self.tried + accepted + (accepted < proposed)
        if self.rate < LOW_ACCEPTANCE:
            self.quiet, self.backoff = self.backoff, min(MAX_BACKOFF, self.backoff * 2)
            self.kept, self.tried = LOW_ACCEPTANCE * 2, 1.0  # a fresh start after the pause
        elif accepted == proposed:
            self.backoff = FIRST_BACKOFF


def may_speculate(seq) -> bool:
    """Whether verifying drafts leaves this row's output as decoding one token a step would: the same tokens
    (greedy), or tokens of the same distribution (sampled: workers/engine/speculation/verify.py). Penalties,
    a logit bias and a grammar are applied position by position there; a row sampled one by one is not."""
    return seq.sampler.batchable


def proposing_state(seq, make):
    """A row's speculation state if it proposes this step: made by `make(seq)` on its first step (False for
    good where it may not speculate); None while it backs off (counting the step) or may not."""
    state = seq.speculation
    if state is None:
        if not may_speculate(seq):
            seq.speculation = False
            return None
        state = seq.speculation = make(seq)
    elif state is False:
        return None
    if state.quiet:
        state.quiet -= 1
        return None
    return state


class NgramProposer:
    """Drafts for a batch's rows, and the counts `/metrics` reports."""

    def __init__(self, config: SpeculativeConfig, device_type: str = "cpu", cost: StepCost | None = None) -> None:
        self.config = config
        self.cost = cost or StepCost.guess(device_type)  # a forward's time by its positions (step_cost.py)
        self.alone = False  # propose only while one row decodes (sliding-window or recurrent layers: proposers.py)
        self.drafts = self.draft_tokens = self.accepted = 0  # since the metrics last took them

    def propose(self, rows: list, waiting: bool = False) -> dict[int, list[int]]:
        """{row: drafts} for the rows that propose this step (rows absent decode one token); `waiting`:
        sequences outside the batch wait for this step too (their prefill), as rows that propose nothing do."""
        config = self.config
        proposals: dict[int, list[int]] = {}
        if self.alone and len(rows) > 1:
            return proposals
        for i, seq in enumerate(rows):
            state = proposing_state(seq, lambda row: RowSpeculation(row.prompt_ids))
            if state is None:
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
        return self.worth_it(proposals, rows, waiting)

    def worth_it(self, proposals: dict[int, list[int]], rows: list, waiting: bool = False) -> dict[int, list[int]]:
        """The proposals cut to the width that pays (`width`); {} when none does."""
        width = self.width({i: len(drafts) for i, drafts in proposals.items()}, rows, waiting)
        return {i: drafts[:width] for i, drafts in proposals.items()} if width else {}

    def width(self, lengths: dict[int, int], rows: list, waiting: bool = False) -> int:
        """How many draft columns a step over `rows` verifies, where row i would propose lengths[i]: the width
        with the most tokens expected per unit of the step's time. Every row computes every column, so w
        columns cost a forward of rows x (w + 1) positions (`self.cost`, measured on the model), and gain each
        proposing row's chance that its first j drafts are kept (its recent rate to the j-th power) for
        j <= w; a width is taken only where it beats one-token steps by MARGIN and, while some rows propose
        nothing or sequences are `waiting` for their prefill, costs them at most SPARED_SLOWDOWN. One row keeps
        about every draft it has; on CPU a batch where some rows propose nothing verifies few columns or none,
        on a GPU every draft."""
        if not lengths:
            return 0
        count = len(rows)
        chances = {i: min(MOST_LIKELY, rows[i].speculation.rate) for i in lengths}
        expected = float(count)  # tokens the step writes: every row's first, then the drafts expected kept
        plain = self.cost(count)
        best, best_rate = 0, MARGIN * expected / plain
        bystanders = waiting or len(lengths) < count  # rows that propose nothing pay for the step's columns too
        for column in range(1, max(lengths.values()) + 1):
            expected += sum(chances[i] ** column for i, length in lengths.items() if length >= column)
            seconds = self.cost(count * (column + 1))
            if bystanders and seconds > SPARED_SLOWDOWN * plain:
                continue
            if expected / seconds > best_rate:
                best, best_rate = column, expected / seconds
        return best

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

