"""Prefill, the runner's half that feeds prompts (workers/engine/execution/runner.py's `ModelRunner`).

A newcomer is prefilled alone, in chunks of at most `prefill_chunk` tokens per engine step, on a
cache of its own; several newcomers' rests may go in one padded forward instead (`prefill_together`,
where the cache kind allows it); a sibling choice of the same prompt starts from a copy.
"""
from __future__ import annotations

import torch

from workers.engine.execution.kv.recompute import prefill_whole_text
from workers.engine.execution.kv.rows import clone_cache, new_row_cache, row_columns, stack_right_aligned
from workers.engine.execution.kv.specs import SLIDING
from workers.engine.execution.media_rows import chunk_media
from workers.engine.execution.mrope import prompt_position_ids
from workers.engine.plan import PrefillOutput, PrefillWork
from workers.engine.sequences import Sequence


class Prefill:
    """What `ModelRunner` does to a prompt before its row joins the batch (it holds the model, the cache's
    spec and the forward: `loaded`, `spec`, `prefill_chunk`, `rope_offsets`, `_forward`, `_cache_inputs`,
    `_cache_of`, and the prefix cache's `_pieces` and `_remember`)."""

    def chunk_for(self, seq: Sequence, budget: int) -> int:
        """How many more prompt tokens a prefill of this sequence takes within `budget`: media features need
        their placeholder tokens in the same forward, and recurrent layers that restart on a multi-token
        chunk need the whole prompt in one (one chunk, whatever the budget); else at most `prefill_chunk`."""
        remaining = len(seq.prefill_ids) - seq.prefilled
        whole = seq.media_inputs is not None or not self.spec.continues_chunks
        return remaining if whole else max(0, min(remaining, budget, self.prefill_chunk))

    def execute_prefill(self, work: PrefillWork) -> PrefillOutput:
        """Run one PrefillWork: a chunk of one prompt, or several prompts' rests together."""
        if work.together:
            return PrefillOutput(list(zip(work.rows, self.prefill_together(list(work.rows)))))
        seq = work.rows[0]
        _, logits = self.prefill(seq, work.tokens)
        return PrefillOutput([(seq, logits)] if logits is not None else [])

    def prefill(self, seq: Sequence, budget: int) -> tuple[int, torch.Tensor | None]:
        """Feed up to `budget` more prompt tokens; returns (tokens used, next-token logits once done)."""
        if self.spec.recomputes:  # no cache (kv/recompute.py): the whole prompt, nothing kept but its tokens
            return prefill_whole_text(self._forward, self.loaded, seq)
        if seq.state is None:
            seq.state = new_row_cache(self.loaded.model.config, self.spec)
            seq.prefilled = 0
        take = self.chunk_for(seq, budget)
        if take <= 0:
            return 0, None
        end, ids = seq.prefilled + take, seq.prefill_ids
        for start, stop in self._pieces(seq, end):
            output = self._prefill_forward(seq, ids, start, stop, last=stop == len(ids))
            if stop == seq.checkpoint_at:  # where this prompt parts from a cached one: later ones start here
                self._remember(ids, seq.state, seq, tokens=stop)
        done = seq.prefilled == len(ids)
        if done and self.rope_offsets:
            seq.rope_table = None  # the offset is all its later tokens need
        return take, output.logits[0, -1] if done else None

    def _prefill_forward(self, seq: Sequence, ids: list[int], start: int, stop: int, last: bool):
        """One forward over tokens [start, stop) of what the sequence prefills (`ids`) on its own cache."""
        positions = range(start, stop)
        scoring = seq.wants_prompt_logprobs and not seq.recomputes
        inputs = self._cache_inputs(seq.state, None if seq.media_inputs is not None else positions)
        if self.rope_offsets and seq.media_inputs is not None:
            inputs["position_ids"] = prompt_position_ids(self.loaded.model, seq, positions)
        output = self._forward(
            [seq], input_ids=torch.tensor([ids[start:stop]], device=self.loaded.device),
            use_cache=True,
            logits_to_keep=0 if scoring else 1,  # echo + logprobs scores every position (once)
            **inputs, **self._media_tensors(seq, positions),
        )
        seq.state = self._cache_of(output)
        seq.prefilled = stop
        if scoring:
            seq.record_prompt_chunk(output.logits[0], last=last)
        return output

    def _media_tensors(self, seq: Sequence, positions: range) -> dict:
        """The processor's tensors for the model's forward over these prompt positions, floating ones in the
        model's dtype."""
        if seq.media_inputs is None:
            return {}
        dtype = self.loaded.model.dtype
        return {key: value.to(self.loaded.device, dtype=dtype if value.is_floating_point() else value.dtype)
                for key, value in chunk_media(seq.media_inputs, positions.start, positions.stop).items()}

    def prefills_together(self, seq: Sequence) -> bool:
        """Whether this prompt may prefill in one padded forward with others: not when the model keeps a
        recurrent state (it cannot be cut apart after), nor, with sliding windows, after a cached start
        (its padding would sit inside the row, and a window of columns would no longer be one of tokens)."""
        return self.spec.prefills_padded and not (self.spec.has(SLIDING) and seq.prefilled) and not seq.recomputes

    def prefill_together(self, sequences: list[Sequence]) -> list[torch.Tensor]:
        """The rest of several newcomers' prompts in one forward; each keeps its own cache rows.

        A newcomer may start from a cached start (`prefilled`: a prefix-cache hit); the cached
        keys/values are stacked right-aligned and the rests left-padded after them, the padding masked
        out (the scheduler keeps it small: `cached_start_groups`) and cut away again when each row
        takes its cache."""
        if len(sequences) == 1:
            seq = sequences[0]
            return [self.prefill(seq, len(seq.prompt_ids) - seq.prefilled)[1]]
        device, config = self.loaded.device, self.loaded.model.config
        cached = [seq.prefilled for seq in sequences]
        longest_cached = max(cached)
        rests = [seq.prompt_ids[start:] for seq, start in zip(sequences, cached)]
        lengths = [len(rest) for rest in rests]
        width = max(lengths)
        pad = self.loaded.tokenizer.pad_token_id or 0
        input_ids = torch.tensor([[pad] * (width - n) + rest for rest, n in zip(rests, lengths)], device=device)
        new_mask = torch.tensor([[0] * (width - n) + [1] * n for n in lengths], device=device)
        mask = torch.tensor([[0] * (longest_cached - c) + [1] * c + row for c, row in zip(cached, new_mask.tolist())],
                            device=device)
        past = (stack_right_aligned(config, [seq.state for seq in sequences], cached) if longest_cached
                else new_row_cache(config, self.spec))
        output = self._forward(
            sequences, input_ids=input_ids, attention_mask=mask, past_key_values=past, use_cache=True, logits_to_keep=1,
            position_ids=torch.tensor(cached, device=device)[:, None] + (new_mask.cumsum(-1) - 1).clamp(min=0),
        )
        for row, (seq, start, length) in enumerate(zip(sequences, cached, lengths)):
            seq.state = row_columns(config, output.past_key_values, row, longest_cached - start, start, length)
            seq.prefilled = start + length
        return list(output.logits[:, -1])

    def share_prefill(self, source: Sequence, sibling: Sequence) -> None:
        """A sibling choice of the same prompt starts from a copy of the prefilled cache."""
        if sibling.max_tokens > 0:
            sibling.state = clone_cache(source.state)
        sibling.prefilled = len(sibling.prompt_ids)
        if self.rope_offsets:
            sibling.rope_offset = source.rope_offset
        if sibling.wants_prompt_logprobs:
            sibling.output.copy_prompt_scores(source.output)
