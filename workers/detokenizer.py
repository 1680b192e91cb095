"""Incremental text for one sequence: stop strings are never split, never returned.

Text that could still grow into a stop string (or an unfinished UTF-8
character) is held back until the next token settles it.
"""
from __future__ import annotations

from transformers import PreTrainedTokenizerBase

REPLACEMENT_CHAR = "\ufffd"


class IncrementalText:
    """`include_stop` keeps the stop string that ended the text (vLLM's include_stop_str_in_output);
    `skip_special_tokens` / `spaces_between_special_tokens` are passed to the tokenizer's decode."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: list[str], include_stop: bool = False,
                 skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.include_stop = include_stop
        self.decode_options = {"skip_special_tokens": skip_special_tokens}
        if not spaces_between_special_tokens:  # the default; fast tokenizers take it only when set
            self.decode_options["spaces_between_special_tokens"] = False
        self.emitted = 0  # characters of the decoded completion already handed out
        self.text = ""

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, clean_up_tokenization_spaces=False, **self.decode_options)

    def _held_back(self, text: str) -> int:
        hold = 0
        for stop in self.stop:
            for length in range(min(len(stop) - 1, len(text)), hold, -1):
                if text.endswith(stop[:length]):
                    hold = length
                    break
        if text.endswith(REPLACEMENT_CHAR):
            hold = max(hold, 1)
        return hold

    def update(self, completion_ids: list[int]) -> tuple[str, bool]:
        """New text to hand out after the latest token, and whether a stop string ended it."""
        self.text = self.decode(completion_ids)
        if self.stop:
            found = [(index, len(s)) for index, s in
                     ((self.text.find(s, max(self.emitted - len(s), 0)), s) for s in self.stop) if index >= 0]
            if found:
                index, length = min(found)
                end = index + length if self.include_stop else index
                delta = self.text[self.emitted:end] if end > self.emitted else ""
                self.emitted = max(self.emitted, end)
                return delta, True
        end = len(self.text) - self._held_back(self.text)
        delta = self.text[self.emitted:end] if end > self.emitted else ""
        self.emitted = max(self.emitted, end)
        return delta, False

    def flush(self) -> str:
        """Whatever was held back, once the sequence ended for another reason."""
        delta = self.text[self.emitted:]
        self.emitted = len(self.text)
        return delta
