"""One choice's output as the client sees it: its text, stop strings, logprobs and parsed parts.

The engine thread decides tokens; this turns them into what goes out, on the output thread
(workers/engine/output/processor.py), so detokenizing, stop strings, logprobs' token texts and the
tool/reasoning parsers cost the decode step nothing. Ownership passes once: the engine builds a
ChoiceOutput with its Sequence (and writes a prompt's scores into it during the prefill, before the
choice's first hand-over); from the first hand-over on only the output thread touches it.

A stop string is found here, after the engine may already have decoded a token or two past it: those
tokens are neither shown nor billed (`billed` counts the tokens taken before the choice ended).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import protocol
from protocol import ChoiceDelta, Logprobs
from workers.engine.output.detokenizer import IncrementalText
from workers.engine.output.token_text import settled_length

logger = logging.getLogger(__name__)


@dataclass
class PendingLogprobs:
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)

    def add(self, token: str, logprob: float | None, top: dict[str, float] | None, offset: int) -> None:
        self.tokens.append(token)
        self.token_logprobs.append(logprob)
        self.top_logprobs.append(top)
        self.text_offset.append(offset)

    def extend(self, other: "PendingLogprobs") -> None:
        for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            getattr(self, name).extend(getattr(other, name))

    def copy(self) -> "PendingLogprobs":
        return PendingLogprobs(list(self.tokens), list(self.token_logprobs), list(self.top_logprobs),
                               list(self.text_offset))

    def as_dict(self) -> Logprobs:
        return {"tokens": self.tokens, "token_logprobs": self.token_logprobs,
                "top_logprobs": self.top_logprobs, "text_offset": self.text_offset}


class ChoiceOutput:
    """What one choice has said and has still to say."""

    def __init__(self, request_id: str, index: int, tokenizer, token_text, output_format, params: protocol.JobParams,
                 stop: list[str], echo_text: str, suffix: str | None, eos_token_ids: list[int], logprobs: bool,
                 parser=None) -> None:
        self.request_id = request_id
        self.index = index
        self.token_text = token_text
        self.suffix = suffix
        self.stop_token_ids = frozenset(params.stop_token_ids)
        self.eos_token_ids = frozenset(() if params.ignore_eos else eos_token_ids)
        self.include_stop = params.include_stop_str_in_output
        # A parsed answer (workers/engine/output/parsing) keeps the special tokens its family's markers are.
        self.parser = parser
        keep_special = parser is not None and output_format.keep_special_tokens
        self.text = IncrementalText(tokenizer, stop, params.include_stop_str_in_output,
                                    params.skip_special_tokens and not keep_special,
                                    params.spaces_between_special_tokens)
        self.ids: list[int] = []  # the tokens taken: what the client is shown and billed
        # Decoded with special tokens for its parser: the ones that are no marker of it stay out of the text.
        self.hidden_ids = output_format.hidden_ids if keep_special and params.skip_special_tokens else None
        self.text_ids: list[int] = [] if self.hidden_ids else self.ids
        self.finish_reason: str | None = None
        self.echo_length = len(echo_text)
        self.pending_text = echo_text
        self.pending_ids: list[int] = []
        self.pending_logprobs: PendingLogprobs | None = PendingLogprobs() if logprobs else None
        self.prompt_logprobs = PendingLogprobs()  # scored prompt tokens, held until the prefill ends
        self.scored_prompt: list[protocol.PromptLogprob | None] | None = None  # vLLM's prompt_logprobs
        self.sent_final = False
        # Plain text (no stop strings, logprobs, parser or hidden tokens): tokens are only collected as
        # they come, and decoded when a delta is taken (each token once, however often deltas go out).
        self.lazy = not self.text.stop and not logprobs and parser is None and self.hidden_ids is None
        self._unread = False  # lazy: tokens taken since the text was last brought up to date
        self._hide_last = False  # lazy: the last token is a stop token or EOS, whose text is not shown

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def billed(self) -> int:
        return len(self.ids)

    # --- written by the engine during the prefill, before the first hand-over ---------------
    def prompt_scored(self, scored_prompt, echo: bool) -> None:
        """The prompt's scores are complete: echo's go before the first token's, vLLM's prompt_logprobs apart."""
        if scored_prompt is not None:
            self.scored_prompt = scored_prompt
        if echo:
            merged = self.prompt_logprobs
            if self.pending_logprobs is not None:
                merged.extend(self.pending_logprobs)
            self.pending_logprobs = merged
        self.prompt_logprobs = PendingLogprobs()

    def copy_prompt_scores(self, source: "ChoiceOutput") -> None:
        """A sibling choice of the same prompt shows the prompt's scores too."""
        self.scored_prompt = source.scored_prompt
        if source.pending_logprobs is not None:
            self.pending_logprobs = source.pending_logprobs.copy()

    # --- the output thread's --------------------------------------------------------------
    def take(self, token_id: int | None, logprob: float | None, top, reason: str | None) -> bool:
        """A token the engine chose (None: none, as at a grammar's dead end) and why the engine ended the
        choice with it (None: it goes on); True when a stop string ended the choice here, which the
        engine has to hear of. Tokens after the choice ended are dropped."""
        if self.finish_reason is not None:
            return False
        if self.lazy:
            if token_id is not None:
                self.ids.append(token_id)
                self.pending_ids.append(token_id)
                self._unread = True
                self._hide_last = (not self.include_stop
                                   and (token_id in self.stop_token_ids or token_id in self.eos_token_ids))
            if reason is not None:
                self.finish(reason)
            return False
        if token_id is not None:
            self._take(token_id, logprob, top)
            hit_stop_id = token_id in self.stop_token_ids or token_id in self.eos_token_ids
            shown_now = self.text_ids is self.ids or token_id not in self.hidden_ids
            if shown_now and self.text_ids is not self.ids:
                self.text_ids.append(token_id)
            # As vLLM: a stop token's (and EOS's) own text is left out unless include_stop_str_in_output.
            shown = self.text_ids[:-1] if hit_stop_id and shown_now and not self.include_stop else self.text_ids
            delta, stopped = self.text.update(shown)
            self.pending_text += delta
            if stopped:
                self.finish("stop", flush=False)
                return reason is None
        if reason is not None:
            self.finish(reason)
        return False

    def _take(self, token_id: int, logprob: float | None, top) -> None:
        if self.pending_logprobs is not None:
            offset = self.echo_length + settled_length(self.text.text)
            shown = {self.token_text(t): lp for t, lp in top}
            shown.setdefault(self.token_text(token_id), logprob)
            self.pending_logprobs.add(self.token_text(token_id), logprob, shown, offset)
        self.ids.append(token_id)
        self.pending_ids.append(token_id)

    def finish(self, reason: str, flush: bool = True) -> None:
        """End the choice; `flush=False` when a stop string ended it (nothing after it is returned)."""
        if self.finished:
            return
        self._read_up()
        if flush:
            self.pending_text += self.text.flush()
        if self.suffix:
            self.pending_text += self.suffix
        self.finish_reason = reason

    def _read_up(self) -> None:
        """Lazy: the text of the tokens taken so far."""
        if self._unread:
            self._unread = False
            delta, _ = self.text.update(self.ids[:-1] if self._hide_last else self.ids)
            self.pending_text += delta

    def _parts(self) -> list[protocol.Part]:
        """The pending text split by the family's parser; should the parser fail, the text is content (and the
        rest of the answer goes unparsed: the web side reads a delta without parts as content)."""
        try:
            parts = self.parser.feed(self.pending_text, self.pending_ids)
            return parts + self.parser.finish() if self.finished else parts
        except Exception:
            logger.exception("%s choice %d: the output parser failed; the rest of the answer is content",
                             self.request_id, self.index)
            self.parser = None
            return [{"type": "content", "text": self.pending_text}] if self.pending_text else []

    def take_delta(self) -> ChoiceDelta | None:
        """What the client has not seen yet, as a protocol ChoiceDelta (None when nothing new)."""
        if self.sent_final:
            return None
        if self._unread:
            self._read_up()
        logprobs = self.pending_logprobs
        if not (self.pending_text or self.pending_ids or (logprobs is not None and logprobs.tokens)
                or self.finish_reason is not None):
            return None
        delta: ChoiceDelta = {
            "index": self.index,
            "text": self.pending_text,
            "token_ids": self.pending_ids,
            "logprobs": None,
            "finish_reason": self.finish_reason,
        }
        if logprobs is not None:
            delta["logprobs"] = logprobs.as_dict()
            self.pending_logprobs = PendingLogprobs()
        if self.scored_prompt is not None:
            delta["prompt_logprobs"], self.scored_prompt = self.scored_prompt, None
        if self.parser is not None:
            delta["parts"] = self._parts()
        self.pending_text, self.pending_ids = "", []
        self.sent_final = self.finish_reason is not None
        return delta
