"""Incremental text for one sequence: stop strings are never split, never returned.

Text that could still grow into a stop string (or an unfinished UTF-8
character) is held back until the next token settles it.
"""
from __future__ import annotations

from transformers import PreTrainedTokenizerBase

REPLACEMENT_CHAR = "\ufffd"


class IncrementalText:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.emitted = 0  # characters of the decoded completion already handed out
        self.text = ""

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

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
            found = [index for index in (self.text.find(s, max(self.emitted - len(s), 0)) for s in self.stop) if index >= 0]
            if found:
                end = min(found)
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
