"""The runner's prefix reuse (kv/prefix_cache.py): where a prompt starts from, and what is kept for later ones.

ModelRunner inherits it; it reads the runner's spec, prefix cache, batch and rows. A prompt looks up
its longest cached start before its prefill; a prefilled prompt, a recurrent model's parting point
and a finished row's prompt and answer are kept, within what the running rows leave of the KV budget.
"""
from __future__ import annotations

from workers.engine.execution.kv.specs import SLIDING, STATE
from workers.engine.execution.media_rows import may_end_at, prefix_root
from workers.engine.sequences import Sequence

# A model whose recurrent layers restart on a multi-token forward continues a cached state one token (one forward)
# at a time: it starts from a prefix hit only where that leaves at most this many prompt tokens.
STEPWISE_REST = 64


class PrefixReuse:
    def attach_prefix(self, seq: Sequence) -> int | None:
        """Before its prefill: start the sequence from the cached keys/values of its prompt's longest
        cached start; returns how many tokens that saves (None: not looked up, as when every position must be scored)."""
        if (self.prefix_cache is None or seq.state is not None or seq.wants_prompt_logprobs
                or not self._caches_prefix_of(seq)):
            return None
        may_end = may_end_at(seq.media_inputs) if seq.media_inputs is not None else None
        stepwise = self.spec.has(STATE) and not self.spec.continues_chunks
        ids = seq.prefill_ids
        hit = self.prefix_cache.lookup(ids, prefix_root(seq), may_end, STEPWISE_REST if stepwise else 0)
        seq.state, seq.prefilled = hit.cache, hit.tokens
        if not seq.recomputes:
            seq.cached_prompt_tokens = seq.prefilled
        rest = len(ids) - hit.shared
        # A recurrent model's blocks run past its checkpoints: plant one where this prompt parts from the cached
        # one (no forward of its own, but the stepwise rest a model that restarts on a multi-token one needs).
        if hit.tokens < hit.shared and rest > 0 and (not stepwise or hit.tokens or rest <= STEPWISE_REST):
            seq.checkpoint_at = hit.shared
        return seq.prefilled

    def remember_prefix(self, seq: Sequence) -> None:
        """Right after its prefill (the cache holds exactly the prompt): keep it for later prompts."""
        if self.prefix_cache is not None and seq.state is not None and self._caches_prefix_of(seq):
            self._remember(seq.prefill_ids, seq.state, seq)

    def _remember(self, ids: list[int], cache, seq: Sequence, tokens: int | None = None) -> None:
        """Into the prefix cache, within what the running rows leave of the KV budget."""
        self.prefix_cache.remember(ids, cache, prefix_root(seq), tokens)
        self.make_room()

    def _remember_answer(self, row: int) -> None:
        """A finished row's prompt and answer (every token its cache holds) for the prefix cache: the next turn of
        a conversation starts past the answer (a recurrent model: from a checkpoint where the row ended)."""
        seq = self.batch_rows[row]
        if len(seq.completion_ids) < 2 or not self._caches_prefix_of(seq) or seq.media_inputs is not None:
            return
        held = seq.prompt_ids + seq.completion_ids[:-1]  # the last token drawn was never fed
        self._remember(held, self.batch.row_contents(row), seq)

    def _caches_prefix_of(self, seq: Sequence) -> bool:
        """Text prompts, and media prompts of attention models whose positions the engine passes
        (execution/media_rows.py)."""
        return seq.media_inputs is None or (self.rope_offsets and not self.spec.has(STATE))

    def _pieces(self, seq: Sequence, end: int) -> list[tuple[int, int]]:
        """The forwards that prefill prompt tokens [prefilled, end): one, or two where a checkpoint is to be
        planted inside; a model whose recurrent layers restart on a multi-token forward takes a fresh prompt's
        start in one and continues a cached state one token at a time (its prefix hits leave short rests)."""
        start = seq.prefilled
        target = seq.checkpoint_at if start < seq.checkpoint_at < end else 0
        if self.spec.continues_chunks:
            return [(start, target), (target, end)] if target else [(start, end)]
        if start > 0:
            return [(token, token + 1) for token in range(start, end)]
        return [(0, target or end)] + [(token, token + 1) for token in range(target or end, end)]

    def _remember_answers(self, rows: list[int]) -> None:
        """Finished rows, before they leave the batch: what their caches hold, for the next turns."""
        if self.prefix_cache is not None and self.remembers_answers and not self.spec.has(SLIDING):
            for row in rows:
                self._remember_answer(row)
