"""The runner's KV cache budget (kv/budget.py): what its rows hold, whether more fit, and preemption.

ModelRunner inherits it; it reads the runner's spec, batch, rows, prefix cache and loaded model.
The scheduler asks it whether a newcomer fits beside the running rows (`kv_projected`,
`make_room`), and preempts rows by recompute through it (`preempt`) when decode outgrows the budget.
"""
from __future__ import annotations

import logging

from workers.engine.errors import ModelLoadError
from workers.engine.execution.kv.apart import rows_apart
from workers.engine.execution.kv.budget import HEADROOM_TOKENS, KVBudget, KVBudgetSetting, kv_budget
from workers.engine.sequences import Sequence

logger = logging.getLogger(__name__)

MIN_CONTEXT = 64  # a KV budget that holds fewer tokens of one sequence fails the model's load
MIB = 1024 * 1024


class KVRoom:
    def _size_budget(self, setting: KVBudgetSetting) -> KVBudget:
        """The model's KV budget; its context capped to the longest sequence the budget holds (a longer request
        is then a 400 that says so); the budget, what fits in it, and how many sequences at full context, logged."""
        budget = kv_budget(self.spec, self.loaded.device, setting)
        loaded, longest = self.loaded, budget.longest(self.spec)
        if longest < MIN_CONTEXT:
            size = f"{budget.bytes / MIB:.1f} MiB" if budget.bytes >= MIB else f"{budget.bytes:,} bytes"
            raise ModelLoadError(f"The model `{loaded.model_id}` cannot be served: its KV cache budget of "
                                 f"{size} holds {longest} tokens of a sequence (at least "
                                 f"{MIN_CONTEXT} needed; {budget.source}); raise it: the model's kv_cache_memory, "
                                 "--kv-cache-memory (INFERENCE_KV_CACHE_MEMORY) or --gpu-memory-utilization.")
        if longest < loaded.max_model_len:
            logger.warning("%s: its context of %d tokens is capped to %d, what its KV cache budget holds",
                           loaded.model_id, loaded.max_model_len, longest)
            loaded.max_model_len = longest
            loaded.context_capped_by = budget.source
        logger.info("%s: KV cache budget %.1f MiB (%s): %s tokens at %.1f KiB each; %.1f sequences at its full "
                    "context of %d tokens", loaded.model_id, budget.bytes / MIB, budget.source,
                    f"{budget.tokens:,}" if budget.token_bytes else "any number of", budget.token_bytes / 1024,
                    budget.concurrency(self.spec, loaded.max_model_len), loaded.max_model_len)
        return budget

    def kv_used(self) -> int:
        """Bytes the model's cache holds now: the batch (every row as long as its longest), rows decoded alone,
        the prefix cache (which gives way first: `make_room`)."""
        solo = sum(self.spec.bytes_for(cached_tokens(seq)) for seq in self.solo_rows if seq.state is not None)
        return self.batch.used_bytes() + solo + self._prefix_bytes()

    def kv_projected(self, joining: list[int] = (), steps: int = 0, leaving: list[Sequence] = ()) -> int:
        """Bytes the model's rows would hold with newcomers of `joining` tokens in, the `leaving` rows out, and
        `steps` more decode steps: in the batch every row as long as its longest, rows decoded alone (or apart:
        kv/apart.py) their own."""
        budget = self.kv_budget
        rows, longest = self.batch.rows + len(joining), max(self.batch.length, *joining, 0)
        # no row goes apart (kv/apart.py) where the rows are within twice each other's lengths or could not save
        # what a row apart must: every step's check and a burst's admission, with no loop over the rows
        shortest = min(*joining, self.batch.shortest if self.batch.rows else longest) if joining else longest
        alike = (not joining or self.apart_least_tokens is None or longest < 2 * shortest
                 or rows * (longest - shortest) < self.apart_least_tokens)
        if self.spec.batchable and not leaving and not self.solo_rows and alike:
            return rows * (budget.row_fixed(longest + steps) + (longest + steps) * budget.token_bytes) if rows else 0
        gone = {id(seq) for seq in leaving}
        alone = [cached_tokens(seq) for seq in self.solo_rows if id(seq) not in gone]
        together = [cached_tokens(seq) for seq in self.batch_rows if id(seq) not in gone] + list(joining)
        if not self.spec.batchable:
            alone, together = alone + together, []
        elif self.apart_least_tokens is not None:
            apart = set(rows_apart(together, len(alone), self.apart_least_tokens))
            alone += [together[i] for i in apart]
            together = [length for i, length in enumerate(together) if i not in apart]
        longest = max(together, default=0) + steps
        held = len(together) * (budget.row_fixed(longest) + longest * budget.token_bytes)
        return held + sum(budget.row_fixed(length + steps) + (length + steps) * budget.token_bytes for length in alone)

    def make_room(self, rows_bytes: int | None = None) -> bool:
        """Whether rows holding `rows_bytes` (default: the running rows, HEADROOM_TOKENS steps on) fit the budget
        beside the prefix cache, whose least recently used entries give way for them where that helps."""
        rows_bytes = self.kv_projected(steps=HEADROOM_TOKENS) if rows_bytes is None else rows_bytes
        over = rows_bytes + self._prefix_bytes() - self.kv_budget.bytes
        if over > 0 and self.prefix_cache is not None:
            self.prefix_cache.evict_to(max(0, self.prefix_cache.bytes - over))
        return rows_bytes + self._prefix_bytes() <= self.kv_budget.bytes

    def _prefix_bytes(self) -> int:
        return self.prefix_cache.bytes if self.prefix_cache is not None else 0

    def preemptible(self, seq: Sequence) -> bool:
        """Whether the row may be preempted by recompute: its tokens alone rebuild its cache (not a media
        prompt's, nor with drafts or M-RoPE offsets kept beside it, nor on ranks that mirror this one)."""
        return (self.remembers_answers and self.proposer is None and not self.rope_offsets
                and not self.spec.recomputes and seq.media_inputs is None)

    def preempt(self, sequences: list[Sequence]) -> None:
        """Drop these rows and their keys/values to free the budget (vLLM's recompute preemption): each
        prefills again later, its prompt and every token it drew (`Sequence.prefill_ids`), and decodes on."""
        leaving = {id(seq) for seq in sequences}
        rows = [i for i, seq in enumerate(self.batch_rows) if id(seq) in leaving]
        if rows:
            self.batch_rows = [self.batch_rows[i] for i in self.batch.remove(rows)]
        self.solo_rows = [seq for seq in self.solo_rows if id(seq) not in leaving]
        self._view = None
        for seq in sequences:
            seq.state, seq.prefilled, seq.checkpoint_at, seq.recomputes = None, 0, 0, True


def cached_tokens(seq: Sequence) -> int:
    """Tokens a prefilled sequence's cache holds: its prompt and every sampled token but the last (the
    next decode step feeds that one)."""
    return len(seq.prompt_ids) + max(0, len(seq.completion_ids) - 1)
