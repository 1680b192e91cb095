"""Echo + logprobs: the prompt's own tokens scored chunk by chunk as its prefill goes, in linear time.

A prompt token's `text_offset` is the length of the decoded prompt before it, up to the start of an
unfinished character (`token_text.settled_length`).
Decoding every prefix is quadratic (seconds at 2k tokens, minutes at 32k), so
`PrefixOffsets` decodes only short windows after the last point where the text
is known to be settled, and adds the settled length. Scoring is vectorised per
prefill chunk, so a long prompt is scored as its chunks go by, never in one piece.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedTokenizerBase

from workers.engine.output.token_text import REPLACEMENT_CHAR, settled_length
from workers.engine.sample.sampling import reported


class PrefixOffsets:
    """`settled_length(decode(ids[:i]))` for i = 0, 1, 2, … in linear time, equal to decoding each prefix.

    Windows start `context` tokens before an anchor (so a decoder that strips the
    first token's leading space, or a character split over tokens, affects only
    the part that is subtracted). A position becomes the next anchor once its
    window text is settled: no unfinished character at its end, and a prefix of
    the text `lookahead` tokens further on.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, ids: list[int], stride: int = 32,
                 context: int = 4, lookahead: int = 4) -> None:
        self.tokenizer = tokenizer
        self.ids = ids
        self.stride, self.context, self.lookahead = stride, context, lookahead
        self.offsets: list[int] = []
        self._anchor = 0  # a position whose prefix text is settled
        self._base = 0  # len(decode(ids[:anchor]))
        self._window_start = 0  # windows are ids[window_start:i]
        self._window_base: int | None = 0  # len(decode(ids[window_start:anchor])), once known

    def upto(self, end: int) -> list[int]:
        """Offsets of positions [0, end)."""
        end = min(end, len(self.ids))
        while len(self.offsets) < end:
            self._extend()
        return self.offsets[:end]

    def _decode(self, windows: list[list[int]]) -> list[str]:
        return self.tokenizer.batch_decode(windows, skip_special_tokens=True)

    def _extend(self) -> None:
        ids, first = self.ids, len(self.offsets)
        last = min(len(ids), first + self.stride + self.lookahead)  # windows end at first..last
        start = self._window_start
        texts = self._decode([ids[start:i] for i in range(first, last + 1)])
        if self._window_base is None:  # the anchor just moved: its window's own length
            self._window_base = len(self._decode([ids[start:self._anchor]])[0])
        emit_to = last if last == len(ids) else last - self.lookahead
        for i in range(first, emit_to):  # a trailing unfinished character lies after the anchor, in the window
            self.offsets.append(self._base + settled_length(texts[i - first]) - self._window_base)
        for j in range(max(first, self._anchor + self.stride), emit_to):
            settled = texts[j - first]
            if settled.endswith(REPLACEMENT_CHAR):
                continue
            if all(texts[k - first].startswith(settled) for k in range(j + 1, min(j + self.lookahead, last) + 1)):
                self._base += len(settled) - self._window_base
                self._anchor = j
                self._window_start = max(0, j - self.context)
                self._window_base = None
                break


class PromptScorer:
    """Log-probabilities of a prompt's own tokens (the first has none), fed one prefill chunk at a time."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, token_text: Callable[[int], str], prompt_ids: list[int],
                 echo_length: int, top_n: int) -> None:
        self.tokenizer = tokenizer
        self.token_text = token_text  # a token as logprobs show it (`token_text.TokenText`)
        self.prompt_ids = prompt_ids
        self.echo_length = echo_length
        self.top_n = top_n
        self.offsets = PrefixOffsets(tokenizer, prompt_ids)
        self.scored = 0  # prompt tokens recorded so far
        self.entries: list[dict | None] = []  # the same scores by token id (vLLM's prompt_logprobs), see by_id()
        self._carry: torch.Tensor | None = None  # logits of the position before the next token

    def _texts(self, ids: list[int]) -> list[str]:
        """`token_text` of each id, decoded in one call; only parts of characters take the slow path."""
        if getattr(self.token_text, "as_ids", False):
            return [self.token_text(t) for t in ids]
        texts = self.tokenizer.batch_decode([[t] for t in ids], skip_special_tokens=False) if ids else []
        return [self.token_text(t) if REPLACEMENT_CHAR in text else text for t, text in zip(ids, texts)]

    def score_chunk(self, chunk_logits: torch.Tensor, record) -> None:
        """`chunk_logits[r]` predicts the token after chunk position r; record(token, logprob, top, offset) each.

        Records every prompt token whose predicting logits are now known (the last
        chunk's final row predicts the first generated token and is not used here).
        """
        begin, end = self.scored, self.scored + chunk_logits.shape[0]
        rows = chunk_logits[:-1] if self._carry is None else torch.cat([self._carry.unsqueeze(0), chunk_logits[:-1]])
        self._carry = chunk_logits[-1]
        ids = self.prompt_ids[begin:end]
        offsets = [min(offset, self.echo_length) for offset in self.offsets.upto(end)[begin:]]
        texts = self._texts(ids)
        start = 0
        if begin == 0:  # the first token has nothing before it to be scored by
            record(texts[0], None, None, offsets[0])
            self.entries.append({"token_id": ids[0], "token": texts[0], "logprob": None, "rank": None, "top": []})
            start = 1
        if start >= len(ids):
            self.scored = end
            return
        logprobs = torch.log_softmax(rows.float(), dim=-1)
        targets = torch.tensor(ids[start:], device=logprobs.device)
        chosen_column = logprobs.gather(1, targets.unsqueeze(1))
        chosen = reported(chosen_column.squeeze(1)).tolist()
        ranks = ((logprobs > chosen_column).sum(dim=1) + 1).tolist() if self.entries is not None else []
        top_ids: list[list[int]] = [[] for _ in chosen]
        top_values: list[list[float]] = [[] for _ in chosen]
        if self.top_n > 0:
            values, indices = torch.topk(logprobs, self.top_n, dim=-1)
            top_ids, top_values = indices.tolist(), reported(values).tolist()
        top_texts = iter(self._texts([t for row in top_ids for t in row]))
        for row, position in enumerate(range(start, len(ids))):
            named = [[token_id, next(top_texts), value] for token_id, value in zip(top_ids[row], top_values[row])]
            self.entries.append({"token_id": ids[position], "token": texts[position], "logprob": chosen[row],
                                 "rank": ranks[row], "top": named})
            top = {text: value for _, text, value in named}
            top.setdefault(texts[position], chosen[row])
            record(texts[position], chosen[row], top, offsets[position])
        self.scored = end

    def by_id(self, top_n: int) -> list[dict]:
        """Every prompt token's score so far, each with its `top_n` most likely alternatives (by id)."""
        return [{**entry, "top": entry["top"][:top_n]} for entry in self.entries]
