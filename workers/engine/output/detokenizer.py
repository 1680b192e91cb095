"""Incremental text for one sequence: stop strings are never split, never returned.

Text that could still grow into a stop string (or an unfinished UTF-8
character) is held back until the next token settles it.

Where the tokenizer is a plain `tokenizers` one, the text comes from its own incremental decoder
(`tokenizers.decoders.DecodeStream`, what TGI streams with: one call into Rust per token); otherwise
each token re-decodes only a short window (the tokens since the last settled point, with the one
before them as context), as vLLM does. Either way a step's cost stays flat however long the answer
grows, and the text equals the whole decode's at every token (an unfinished character as "\ufffd").
"""
from __future__ import annotations

from collections.abc import Callable

from tokenizers.decoders import DecodeStream
from transformers import PreTrainedTokenizerBase

REPLACEMENT_CHAR = "\ufffd"


def _plain_backend(tokenizer: PreTrainedTokenizerBase, spaces_between_special_tokens: bool):
    """The Rust tokenizer, where the transformers class adds nothing to its decode; else None."""
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    backend = getattr(tokenizer, "_tokenizer", None)
    plain = (isinstance(tokenizer, TokenizersBackend) and backend is not None and spaces_between_special_tokens
             and type(tokenizer).decode is TokenizersBackend.decode and type(tokenizer)._decode is TokenizersBackend._decode)
    return backend if plain else None


def text_decoder(tokenizer: PreTrainedTokenizerBase, skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True) -> Callable[[list[int]], str]:
    """`tokenizer.decode(ids, clean_up_tokenization_spaces=False, ...)`, called on the Rust tokenizer
    directly where the class adds nothing to it (the Python wrapper costs more than the decode)."""
    backend = _plain_backend(tokenizer, spaces_between_special_tokens)
    if backend is not None:
        return lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
    options = {"skip_special_tokens": skip_special_tokens}
    if not spaces_between_special_tokens:  # the default; fast tokenizers take it only when set
        options["spaces_between_special_tokens"] = False
    return lambda ids: tokenizer.decode(ids, clean_up_tokenization_spaces=False, **options)


class IncrementalText:
    """`include_stop` keeps the stop string that ended the text (vLLM's include_stop_str_in_output);
    `skip_special_tokens` / `spaces_between_special_tokens` are passed to the tokenizer's decode."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: list[str], include_stop: bool = False,
                 skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True) -> None:
        self.decode = text_decoder(tokenizer, skip_special_tokens, spaces_between_special_tokens)
        backend = _plain_backend(tokenizer, spaces_between_special_tokens)
        self._backend = backend
        self.include_stop = include_stop
        self.stop = [s for s in stop if s]
        if backend is not None:
            self._stream_step = DecodeStream(skip_special_tokens=skip_special_tokens).step
            if not self.stop:  # the common case (every streamed token of every plain answer) kept short
                self.update = self._update_streamed
        self._fed = 0  # tokens given to the stream
        self.emitted = 0  # characters of the decoded completion already handed out
        self.text = ""  # the whole completion decoded (a trailing unfinished character as "\ufffd")
        self._settled = ""  # text of the tokens before `_read`: whole characters only
        self._context = 0  # the window starts here: one settled piece before `_read`, for the decoder's context
        self._read = 0
        self._context_text = ""  # decode(ids[_context:_read])

    def _advance(self, completion_ids: list[int]) -> None:
        if self._backend is not None:
            self._advance_stream(completion_ids)
            return
        window = self.decode(completion_ids[self._context:])
        piece = window[len(self._context_text):]
        if piece and not piece.endswith(REPLACEMENT_CHAR):
            self._settled += piece
            self.text = self._settled
            self._context, self._read = self._read, len(completion_ids)
            self._context_text = self.decode(completion_ids[self._context:self._read])
        else:
            self.text = self._settled + piece

    def _advance_stream(self, completion_ids: list[int]) -> None:
        """The stream's pieces; while it holds an unfinished character back, the text shows it as the whole
        decode does, from a window after the last piece."""
        step, backend = self._stream_step, self._backend
        for position in range(self._fed, len(completion_ids)):
            piece = step(backend, completion_ids[position])
            if piece is not None:
                self._settled += piece
                self._read = position + 1
        self._fed = len(completion_ids)
        if self._read == len(completion_ids):
            self.text = self._settled
            return
        start = max(0, self._read - 1)
        window = self.decode(completion_ids[start:])
        self.text = self._settled + window[len(self.decode(completion_ids[start:self._read])):]

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
        self._advance(completion_ids)
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

    def _update_streamed(self, completion_ids: list[int]) -> tuple[str, bool]:
        """`update` where the Rust stream decodes and no stop string is looked for: `_held_back` is then only
        an unfinished character's hold, in a line."""
        self._advance_stream(completion_ids)
        text, emitted = self.text, self.emitted
        end = len(text) - 1 if text.endswith(REPLACEMENT_CHAR) else len(text)
        if end <= emitted:
            return "", False
        self.emitted = end
        return text[emitted:end], False

    def flush(self) -> str:
        """Whatever was held back, once the sequence ended for another reason."""
        delta = self.text[self.emitted:]
        self.emitted = len(self.text)
        return delta
