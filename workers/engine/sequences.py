"""A job as the engine holds it: one GenerationJob with a Sequence per returned choice (a job, not an HTTP request)."""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field

import torch

import protocol
from protocol import rest_of_context
from protocol import ChoiceDelta, JobParams, Logprobs, Prompt, Started, Structured, SubmitMessage, Usage
from workers.engine.inputs.chat_templates import render_fitting, render_prompt
from workers.engine.config import TemplateSettings
from workers.engine.sample.constraints import Constraint
from workers.engine.output.detokenizer import IncrementalText
from workers.engine.errors import JobError
from workers.engine.models.model_loader import LoadedModel
from workers.engine.output.parsing import make_parser
from workers.engine.output.parsing.factory import open_reasoning
from workers.engine.output.parsing.tool_grammars import banned_markers, in_family_syntax
from workers.engine.inputs.prompt_scoring import PromptScorer
from workers.engine.sample.sampling import Sampler, SamplingParams, TokenChoice
from workers.engine.output.token_text import TokenIdText, TokenText, settled_length

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

    def as_dict(self) -> Logprobs:
        return {"tokens": self.tokens, "token_logprobs": self.token_logprobs,
                "top_logprobs": self.top_logprobs, "text_offset": self.text_offset}


class Sequence:
    """One choice being generated: its tokens, its sampler, its text, its model state."""

    def __init__(self, request: "GenerationJob", index: int, prompt_index: int, prompt_ids: list[int], echo_text: str,
                 sampler: Sampler, max_tokens: int, stop: list[str], suffix: str | None, parser=None) -> None:
        self.request = request
        self.index = index
        self.prompt_index = prompt_index  # choices of one prompt share its prefill
        self.prefilled = 0
        self.prompt_ids = prompt_ids
        self.sampler = sampler
        self.max_tokens = max_tokens
        self.suffix = suffix
        params = request.params
        self.stop_token_ids = set(params.stop_token_ids)
        self.include_stop = params.include_stop_str_in_output
        # A parsed answer (workers/engine/output/parsing) keeps the special tokens its family's markers are.
        self.parser = parser
        keep_special = parser is not None and request.model.output_format.keep_special_tokens
        self.text = IncrementalText(request.model.tokenizer, stop, params.include_stop_str_in_output,
                                    params.skip_special_tokens and not keep_special,
                                    params.spaces_between_special_tokens)
        self.completion_ids: list[int] = []
        # Decoded with special tokens for its parser: the ones that are no marker of it stay out of the text.
        self.hidden_ids = request.model.output_format.hidden_ids if keep_special and params.skip_special_tokens else None
        self.text_ids: list[int] = [] if self.hidden_ids else self.completion_ids
        self.state = None  # the runner's per-sequence model state (KV cache)
        self.media_inputs: dict | None = None  # processor tensors the prompt's prefill takes (pixel_values, …)
        self.finish_reason: str | None = None
        self.echo_length = len(echo_text)
        self.pending_text = echo_text
        self.pending_ids: list[int] = []
        self.pending_logprobs: PendingLogprobs | None = PendingLogprobs() if sampler.params.logprobs is not None else None
        self.echo_scoring = request.echo and self.pending_logprobs is not None
        self.wants_prompt_logprobs = self.echo_scoring or params.prompt_logprobs is not None
        self.prompt_logprobs = PendingLogprobs()  # scored prompt tokens, held until the prefill ends
        self.scored_prompt: list[protocol.PromptLogprob | None] | None = None  # vLLM's prompt_logprobs
        top_n = max(sampler.params.logprobs or 0, params.prompt_logprobs or 0)
        self.prompt_scorer = PromptScorer(request.model.tokenizer, request.token_text, prompt_ids, self.echo_length,
                                          top_n) if self.wants_prompt_logprobs else None
        self.sent_final = False
        self.constraint: Constraint | None = None  # set once the request's grammar is compiled
        self.paused = False  # preempted: out of the batch with its keys/values in `state`, waiting to rejoin

    # Who the scheduler serves it for (workers/engine/core/fair_share.py).
    @property
    def team(self) -> str:
        return self.request.team

    @property
    def share(self) -> float:
        return self.request.share

    @property
    def priority_class(self) -> str:
        return self.request.priority_class

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def _token_text(self, token_id: int) -> str:
        return self.request.token_text(token_id)

    def _top(self, choice: TokenChoice) -> dict[str, float]:
        top = {self._token_text(t): lp for t, lp in choice.top}
        top.setdefault(self._token_text(choice.token_id), choice.logprob)
        return top

    def record_prompt_chunk(self, chunk_logits: torch.Tensor, last: bool) -> None:
        """Echo + logprobs: score the prompt tokens this prefill chunk settles; all go out with the first token."""
        self.prompt_scorer.score_chunk(chunk_logits, self.prompt_logprobs.add)
        if last and self.request.params.prompt_logprobs is not None:
            self.scored_prompt = self.prompt_scorer.by_id(self.request.params.prompt_logprobs)
        if last and not self.echo_scoring:
            self.prompt_logprobs = PendingLogprobs()
        elif last:
            merged = self.prompt_logprobs
            for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                getattr(merged, name).extend(getattr(self.pending_logprobs, name))
            self.pending_logprobs, self.prompt_logprobs = merged, PendingLogprobs()

    def copy_prompt_logprobs(self, source: "Sequence") -> None:
        self.scored_prompt = source.scored_prompt
        theirs = source.pending_logprobs
        if theirs is not None:
            self.pending_logprobs = PendingLogprobs(list(theirs.tokens), list(theirs.token_logprobs),
                                                    list(theirs.top_logprobs), list(theirs.text_offset))

    def abort(self) -> None:
        """The client is gone: stop without producing anything more."""
        self.finish_reason = "cancelled"
        self.state = None

    def dead_end(self, reason: str) -> None:
        """The grammar admits no token: end this choice as complete ("stop"), not the request."""
        logger.warning("%s choice %d: grammar dead end after %d tokens (%s); finishing it", self.request.request_id,
                       self.index, len(self.completion_ids), reason)
        self.finish("stop")

    def accept(self, choice: TokenChoice | None) -> None:
        """Take the sampled token: extend the text, decide whether the sequence ends."""
        if choice is None:
            self.dead_end("no token allowed")
            return
        offset_before = self.echo_length + settled_length(self.text.text)
        self.completion_ids.append(choice.token_id)
        self.pending_ids.append(choice.token_id)
        if self.pending_logprobs is not None:
            self.pending_logprobs.add(self._token_text(choice.token_id), choice.logprob, self._top(choice), offset_before)
        params = self.sampler.params
        hit_eos = choice.token_id in self.sampler.eos_token_ids and not params.ignore_eos
        hit_stop_id = choice.token_id in self.stop_token_ids
        shown_now = self.text_ids is self.completion_ids or choice.token_id not in self.hidden_ids
        if shown_now and self.text_ids is not self.completion_ids:
            self.text_ids.append(choice.token_id)
        # As vLLM: a stop token's (and EOS's) own text is left out unless include_stop_str_in_output.
        shown = self.text_ids[:-1] if (hit_stop_id or hit_eos) and shown_now and not self.include_stop else self.text_ids
        delta, stopped = self.text.update(shown)
        self.pending_text += delta
        if self.constraint is not None and not hit_eos and not self.constraint.consume(choice.token_id):
            self.dead_end(self.constraint.error or "token refused")
        elif stopped:
            self.finish("stop", flush=False)
        elif hit_eos or hit_stop_id or (self.constraint is not None and self.constraint.complete):
            self.finish("stop")
        elif len(self.completion_ids) >= self.max_tokens:
            self.finish("length")

    def finish(self, reason: str, flush: bool = True) -> None:
        """End the sequence; `flush=False` when a stop string ended it (nothing after it is returned)."""
        if self.finished:
            return
        if flush:
            self.pending_text += self.text.flush()
        if self.suffix:
            self.pending_text += self.suffix
        self.finish_reason = reason
        self.state = None

    def _parts(self) -> list[protocol.Part]:
        """The pending text split by the family's parser; should the parser fail, the text is content (and the
        rest of the answer goes unparsed: the web side reads a delta without parts as content)."""
        try:
            parts = self.parser.feed(self.pending_text, self.pending_ids)
            return parts + self.parser.finish() if self.finished else parts
        except Exception:
            logger.exception("%s choice %d: the output parser failed; the rest of the answer is content",
                             self.request.request_id, self.index)
            self.parser = None
            return [{"type": "content", "text": self.pending_text}] if self.pending_text else []

    def take_delta(self) -> ChoiceDelta | None:
        """What the client has not seen yet, as a protocol ChoiceDelta (None when nothing new)."""
        if self.sent_final:
            return None
        has_logprobs = self.pending_logprobs is not None and self.pending_logprobs.tokens
        if not (self.pending_text or self.pending_ids or has_logprobs or self.finished):
            return None
        delta: ChoiceDelta = {
            "index": self.index,
            "text": self.pending_text,
            "token_ids": self.pending_ids,
            "logprobs": self.pending_logprobs.as_dict() if self.pending_logprobs is not None else None,
            "finish_reason": self.finish_reason,
        }
        if self.scored_prompt is not None:
            delta["prompt_logprobs"], self.scored_prompt = self.scored_prompt, None
        if self.parser is not None:
            delta["parts"] = self._parts()
        self.pending_text, self.pending_ids = "", []
        if self.pending_logprobs is not None:
            self.pending_logprobs = PendingLogprobs()
        self.sent_final = self.finished
        return delta


class GenerationJob:
    """One submitted job: its prompts tokenized and checked, one Sequence per choice."""

    def __init__(self, job: SubmitMessage, model: LoadedModel, templates: TemplateSettings) -> None:
        self.request_id: str = job["request_id"]
        self.reply_channel: str = job["reply_channel"]
        self.model = model
        self.arrived = time.monotonic()
        params = self.params = JobParams.from_wire(job["params"])
        self.token_text = TokenIdText() if params.return_tokens_as_token_ids else TokenText(model.tokenizer)
        self.echo = params.echo
        self.streamed = params.stream  # False: published when the first token comes and when done
        team = job.get("team") or {}
        self.team: str = team.get("name", "")  # fair share: whose line it waits in, with what weight
        self.share: float = float(team.get("share", 1.0))
        self.priority_class: str = params.priority_class
        self.answered = False  # something was published
        if model.kind == "speech":
            raise JobError(400, f"The model `{model.model_id}` turns speech into text: send its audio to "
                           "/v1/audio/transcriptions.", "model", "unsupported_model")
        if model.kind == "embedding":
            raise JobError(400, f"The model `{model.model_id}` is an embedding model: send its inputs to "
                           "/v1/embeddings.", "model", "unsupported_model")
        if model.kind == "cross_encoder":
            raise JobError(400, f"The model `{model.model_id}` is a cross-encoder (it scores text pairs): send its "
                           "pairs to /v1/score or /v1/rerank.", "model", "unsupported_model")
        self.media_inputs: list[dict | None] = []  # per prompt
        self.prompt_texts: list[str] = []  # per prompt: a rendered conversation's text, for its parser ("" otherwise)
        self.prompt_ids = [self._truncate(self._tokenize(prompt, templates, params.max_tokens), index)
                           for index, prompt in enumerate(job["prompts"])]
        max_tokens = self._max_tokens(params.max_tokens)
        self._check_limits(max_tokens, params)
        sampling = SamplingParams.from_job(params, model.generation_defaults)
        sampling.bad_words_ids += self._bad_words_ids(params.bad_words)
        sampling.bad_words_ids += self._bad_words_ids(banned_markers(model.output_format) if params.ban_tool_calls else [])
        self.structured: Structured | None = params.structured
        if self.structured and self.structured["type"] == "tool_call":  # written in the model's own syntax
            self.structured = in_family_syntax(self.structured, model.output_format, open_reasoning(
                model.output_format, self.prompt_texts[0]) if self.prompt_texts else None)
        num_beams = params.num_beams
        self.beam: dict | None = None  # beam search settings; None for the continuous batch
        if num_beams > 1:
            if model.adapter is not None:
                raise JobError(400, "Beam search is not served for LoRA adapters; use the base model or n.",
                               "num_beams", "unsupported_parameter")
            self._check_beam_request(num_beams, params)
            self.beam = {"num_beams": num_beams, "length_penalty": float(params.length_penalty),
                         "early_stopping": params.early_stopping}
        n = params.n
        self.sequences: list[Sequence] = []
        for prompt_index, (prompt, ids) in enumerate(zip(job["prompts"], self.prompt_ids)):
            echo_text = self._echo_text(prompt, ids) if self.echo else ""
            # min_length counts the prompt too, as in Hugging Face's generate (and forgather).
            min_tokens = max(sampling.min_tokens, params.min_length - len(ids))
            prompt_sampling = dataclasses.replace(sampling, min_tokens=min_tokens)
            for sample in range(n):
                sampler = Sampler(prompt_sampling, model.eos_token_ids, model.device, seed_offset=sample)
                seq = Sequence(self, prompt_index * n + sample, prompt_index, ids, echo_text, sampler, max_tokens,
                               params.stop or model.default_stop, params.suffix, self._parser(prompt_index, prompt))
                seq.media_inputs = self.media_inputs[prompt_index]
                self.sequences.append(seq)

    def _parser(self, prompt_index: int, prompt: Prompt):
        """A conversation's answer, parsed as the model's family writes it (chat and Responses ask)."""
        params, fmt = self.params, self.model.output_format
        if not params.parse_output or fmt is None or not isinstance(prompt, (dict, str)):
            return None
        tools = prompt.get("tools") if isinstance(prompt, dict) else None
        return make_parser(fmt, self.prompt_texts[prompt_index], tools, params.parse_tools,
                           None if params.parallel_tool_calls else 1)

    def _truncate(self, ids: list[int], index: int) -> list[int]:
        """vLLM's truncate_prompt_tokens: keep the prompt's last N tokens (-1: the model's context)."""
        keep = self.params.truncate_prompt_tokens
        if keep is None:
            return ids
        keep = self.model.max_model_len if keep < 0 else keep
        if self.media_inputs[index] is not None and keep < len(ids):
            raise JobError(400, "truncate_prompt_tokens cannot cut a prompt with images, audio or video.",
                           "truncate_prompt_tokens", "invalid_value")
        return ids[-keep:] if keep < len(ids) else ids

    def _tokenize(self, prompt: Prompt, templates: TemplateSettings, max_tokens: int | None = None) -> list[int]:
        if isinstance(prompt, dict):  # a conversation to render, or text with tokenizer options
            from workers.engine.inputs.media_prompts import has_media, render_media_conversation

            if has_media(prompt):
                rendered = render_media_conversation(self.model, prompt, templates)
            elif prompt.get("truncate_to_fit"):
                budget = self.model.max_model_len - (max_tokens or 1)
                rendered = render_fitting(self.model.tokenizer, prompt, templates, budget)
            else:
                rendered = render_prompt(self.model.tokenizer, prompt, templates)
            self.prompt_texts.append(rendered.text)
            self.media_inputs.append(rendered.media_inputs)
            return rendered.ids
        self.media_inputs.append(None)
        self.prompt_texts.append(prompt if isinstance(prompt, str) else "")
        if isinstance(prompt, str):
            return list(self.model.tokenizer(prompt, add_special_tokens=True)["input_ids"])
        vocab = self.model.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise JobError(400, f"Token ids in the prompt must be in [0, {vocab}).", "prompt", "invalid_token_id")
        return list(prompt)

    def _check_beam_request(self, num_beams: int, params: JobParams) -> None:
        unsupported = [name for name, on in (("logprobs", params.logprobs is not None),
                                              ("structured outputs", bool(params.structured)),
                                              ("prompt_logprobs", params.prompt_logprobs is not None),
                                              ("allowed_token_ids", bool(params.allowed_token_ids)),
                                              ("stop_token_ids", bool(params.stop_token_ids))) if on]
        if unsupported:
            raise JobError(400, f"Beam search (num_beams > 1) does not support {unsupported[0]}.", "num_beams",
                           "unsupported_parameter")
        if params.n > num_beams:
            raise JobError(400, f"n ({params.n}) must not exceed num_beams ({num_beams}).", "n", "invalid_value")

    def _bad_words_ids(self, words: list[str]) -> list[list[int]]:
        """Each banned string as tokens, alone and after a space (how it appears mid-text)."""
        banned: list[list[int]] = []
        for word in words:
            for text in (word, " " + word.lstrip()):
                ids = list(self.model.tokenizer(text, add_special_tokens=False)["input_ids"])
                if ids and ids not in banned:
                    banned.append(ids)
        return banned

    def constrain(self, template) -> None:
        """Give every choice its own copy of the compiled grammar (an llguidance matcher)."""
        for seq in self.sequences:
            seq.constraint = Constraint(template.deep_copy())

    def _echo_text(self, prompt: Prompt, ids: list[int]) -> str:
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, dict):
            if "text" in prompt:
                return prompt["text"]
            return self.model.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return self.model.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _max_tokens(self, requested: int | None) -> int:
        """None (chat's default, as vLLM): the model's generation_config.json max_new_tokens, else whatever the
        context leaves after the longest prompt (never more than that)."""
        if requested is not None:
            return int(requested)
        rest = rest_of_context([len(ids) for ids in self.prompt_ids], self.model.max_model_len)
        default = self.model.generation_defaults.get("max_new_tokens")
        return min(int(default), rest) if isinstance(default, int) and default > 0 else rest

    def _check_limits(self, max_tokens: int, params: JobParams) -> None:
        limit = self.model.max_model_len
        for ids in self.prompt_ids:
            if len(ids) + max_tokens > limit:
                raise JobError(400, context_error(limit, len(ids), max_tokens),
                               "prompt" if len(ids) >= limit else "max_tokens", "context_length_exceeded")
        vocab = self.model.vocab_size
        bad = [k for k in (params.logit_bias or {}) if not 0 <= int(k) < vocab]
        if bad:
            raise JobError(400, f"Invalid token id {bad[0]} in logit_bias: the vocabulary has {vocab} tokens.",
                           "logit_bias", "invalid_token_id")
        bounds = (("top_k", params.top_k or 0, vocab, "the vocabulary size"),
                  ("min_tokens", params.min_tokens, max_tokens, "max_tokens (or the context left)"),
                  ("no_repeat_ngram_size", params.no_repeat_ngram_size, limit, "the context length"))
        for name, value, most, what in bounds:
            if value > most:
                raise JobError(400, f"{name} must be at most {what}, {most}; got {value}.", name, "invalid_value")
        for name, ids in (("bad_words_ids", [t for ids in params.bad_words_ids for t in ids]),
                          ("stop_token_ids", params.stop_token_ids), ("allowed_token_ids", params.allowed_token_ids or [])):
            bad = [t for t in ids if not 0 <= int(t) < vocab]
            if bad:
                raise JobError(400, f"Invalid token id {bad[0]} in {name}: the vocabulary has {vocab} tokens.",
                               name, "invalid_token_id")

    @property
    def finished(self) -> bool:
        return all(seq.finished for seq in self.sequences)

    def started_message(self) -> Started:
        return {"type": protocol.STARTED, "model": self.model.model_id,
                "prompt_tokens": [len(ids) for ids in self.prompt_ids], "prompt_token_ids": self.prompt_ids,
                "max_model_len": self.model.max_model_len}

    def usage(self) -> Usage:
        return {"prompt_tokens": sum(len(ids) for ids in self.prompt_ids),
                "completion_tokens": sum(len(seq.completion_ids) for seq in self.sequences)}

    def due(self, stream_interval: int) -> bool:
        """Whether an answered, unfinished job's new deltas go out now: a streamed one's as they come, or
        once a choice holds `stream_interval` new tokens (SGLang's and vLLM's `--stream-interval`); a
        non-streamed one's never."""
        if not self.streamed:
            return False
        return stream_interval <= 1 or any(len(seq.pending_ids) >= stream_interval for seq in self.sequences)

    def take_deltas(self) -> list[ChoiceDelta]:
        return [delta for seq in self.sequences if (delta := seq.take_delta()) is not None]


def context_error(limit: int, prompt: int, max_tokens: int) -> str:
    """What fits, said in the request's terms: the worker names the fields `prompt` and `max_tokens` in
    backticks, and the web side says them as the endpoint calls them (messages, max_completion_tokens…)."""
    said = f"This model's maximum context length is {limit} tokens"
    if prompt >= limit:
        fits = f"shorten the `prompt` to at most {limit - max(max_tokens, 1)} tokens"
        if max_tokens > 1:
            fits += f" (or to {limit - 1} with a smaller `max_tokens`)"
        return (f"{said}, and the `prompt` alone is {prompt} tokens: {fits}. A chat's tools and system prompt count "
                "as prompt tokens; send fewer, or use a model with a longer context.")
    fits = f"set `max_tokens` to at most {limit - prompt}"
    if limit - max_tokens > 0:
        fits += f", or shorten the `prompt` to at most {limit - max_tokens} tokens"
    return (f"{said}. However, you requested {prompt + max_tokens} tokens ({prompt} in your prompt and "
            f"{max_tokens} for the completion): {fits}.")
