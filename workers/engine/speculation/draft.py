"""A draft model as the proposer (vLLM's `draft_model`): a smaller catalog model with the target's tokenizer
guesses each row's next tokens greedily, and the target verifies them in its batched step as it verifies
n-gram drafts (workers/engine/speculation/verify.py: greedy drafts are one token each, so sampled rows keep
their distribution too).

Each proposing row keeps the draft's own cache of its tokens (a transformers DynamicCache, full attention
only): a step feeds the draft the row's tokens it has not seen (the last step's accepted run and bonus
token) and then `num_speculative_tokens - 1` of its own guesses one at a time, and crops the cache back to
the row's real tokens. Rows are drafted one after another (not batched): a first cut, fine for a few
streams, where the draft's cost per row matters most.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from protocol.speculative import SpeculativeConfig
from workers.engine.errors import ModelLoadError
from workers.engine.execution.kv.specs import FULL, NONE, cache_spec
from workers.engine.speculation.rows import NgramProposer, RowSpeculation, proposing_state
from workers.engine.speculation.step_cost import StepCost


def check_same_tokenizer(target, draft) -> None:
    """A draft's token ids must mean the target's: refused with the difference named."""
    if draft is target:
        return
    ours, theirs = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if ours != theirs:
        differ = len(set(ours.items()) ^ set(theirs.items()))
        raise ModelLoadError(
            f"speculative decoding: the draft model {draft.model_id} has another tokenizer than {target.model_id} "
            f"({len(theirs)} tokens vs {len(ours)}, {differ} entries differ); a draft must share the target's "
            "tokenizer")
    spec = cache_spec(draft.model, draft.device)
    if any(layer.kind not in (FULL, NONE) for layer in spec.layers) or not spec.takes_positions:
        raise ModelLoadError(f"speculative decoding: the draft model {draft.model_id} must cache full attention "
                             f"alone and take positions (its cache: {spec.describe()})")


class DraftRow(RowSpeculation):
    """A row's proposer state and the draft's cache of its tokens (`seen` of them)."""

    __slots__ = ("cache", "seen")

    def __init__(self, prompt_ids: list[int], config) -> None:
        super().__init__(prompt_ids)
        self.cache = DynamicCache(config=config)
        self.seen = 0


class DraftProposer(NgramProposer):
    """Drafts from a draft model, by row; the counts, back-off and width choice are the n-gram proposer's."""

    def __init__(self, config: SpeculativeConfig, draft, device_type: str = "cpu",
                 cost: StepCost | None = None) -> None:
        super().__init__(config, device_type, cost)
        self.draft = draft

    @torch.no_grad()
    def propose(self, rows: list, waiting: bool = False) -> dict[int, list[int]]:
        proposals: dict[int, list[int]] = {}
        wanted: dict[int, int] = {}  # row -> drafts it has room for
        if self.alone and len(rows) > 1:
            return proposals
        for i, seq in enumerate(rows):
            if proposing_state(seq, lambda row: DraftRow(row.prompt_ids, self.draft.model.config)) is None:
                continue
            room = min(seq.max_tokens - len(seq.completion_ids) - 1, self.config.num_speculative_tokens)
            if room >= 1:
                wanted[i] = room
        width = self.width(wanted, rows, waiting)  # decided before drafting: a guess costs a forward of the draft
        if not width:
            return proposals
        for i, room in wanted.items():
            seq = rows[i]
            proposals[i] = self._guess(seq.speculation, seq.prompt_ids + seq.completion_ids, min(room, width))
        return proposals

    def _guess(self, state: DraftRow, tokens: list[int], count: int) -> list[int]:
        """`count` greedy guesses after `tokens`; the draft's cache ends holding `tokens` alone."""
        model, device = self.draft.model, self.draft.device
        known = len(tokens)
        fed = tokens[state.seen:]
        guesses: list[int] = []
        position = state.seen
        while len(guesses) < count:
            logits = model(input_ids=torch.tensor([fed], device=device), past_key_values=state.cache, use_cache=True,
                           position_ids=torch.arange(position, position + len(fed), device=device)[None],
                           logits_to_keep=1).logits
            position += len(fed)
            guesses.append(int(logits[0, -1].argmax()))
            fed = guesses[-1:]
        extra = state.cache.get_seq_length() - known
        if extra > 0:
            state.cache.crop(-extra)  # transformers 5: a negative count of tokens to drop
        state.seen = known
        return guesses
