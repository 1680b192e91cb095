"""A generation job's input processing: its prompts rendered, tokenized, truncated and checked, its sampling
resolved, its grammar and beams set up, and one Sequence (decode state) with its ChoiceOutput (what the
client sees) per returned choice. Nothing here runs per step."""
from __future__ import annotations

import dataclasses
import logging
import time

import protocol
from protocol import rest_of_context
from protocol import ChoiceDelta, JobParams, Prompt, Started, Structured, SubmitMessage, Usage
from workers.engine.inputs.chat_templates import render_fitting, render_prompt
from workers.engine.inputs.prompt_parts import conversation_parts
from workers.engine.config import TemplateSettings
from workers.engine.sample.constraints import Constraint
from workers.engine.output.choice_output import ChoiceOutput
from workers.engine.errors import JobError
from workers.engine.models.model_loader import LoadedModel
from workers.engine.output.parsing import make_parser
from workers.engine.output.parsing.factory import open_reasoning
from workers.engine.output.parsing.tool_grammars import banned_markers, in_family_syntax
from workers.engine.inputs.prompt_scoring import PromptScorer
from workers.engine.sample.sampling import Sampler, SamplingParams
from workers.engine.output.token_text import TokenIdText, TokenText
from workers.engine.sequences import Handover, Sequence

logger = logging.getLogger(__name__)


class GenerationJob:
    """One submitted job: its prompts tokenized and checked, one Sequence per choice."""

    def __init__(self, job: SubmitMessage, model: LoadedModel, templates: TemplateSettings,
                 handover: Handover | None = None) -> None:
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
        self.answered = False  # something was published (the output thread's)
        self.closed = False  # nothing more goes out: answered in full, failed or cancelled
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
        self._check_limits(max_tokens, params, job["prompts"], templates)
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
        self.max_tokens = max_tokens  # resolved once: Started carries it to the web side
        self.sequences: list[Sequence] = []
        handover = handover if handover is not None else Handover()
        stop = params.stop or model.default_stop
        for prompt_index, (prompt, ids) in enumerate(zip(job["prompts"], self.prompt_ids)):
            echo_text = self._echo_text(prompt, ids) if self.echo else ""
            # min_length counts the prompt too, as in Hugging Face's generate (and forgather).
            min_tokens = max(sampling.min_tokens, params.min_length - len(ids))
            prompt_sampling = dataclasses.replace(sampling, min_tokens=min_tokens)
            for sample in range(n):
                index = prompt_index * n + sample
                sampler = Sampler(prompt_sampling, model.eos_token_ids, model.device, seed_offset=sample)
                logprobs = sampler.params.logprobs is not None
                output = ChoiceOutput(self.request_id, index, model.tokenizer, self.token_text, model.output_format,
                                      params, stop, echo_text, params.suffix, model.eos_token_ids, logprobs,
                                      self._parser(prompt_index, prompt))
                echo_scoring = self.echo and logprobs
                scorer = None
                if echo_scoring or params.prompt_logprobs is not None:
                    top_n = max(sampler.params.logprobs or 0, params.prompt_logprobs or 0)
                    scorer = PromptScorer(model.tokenizer, self.token_text, ids, len(echo_text), top_n)
                seq = Sequence(self, index, prompt_index, ids, sampler, max_tokens, output, handover, scorer,
                               echo_scoring)
                seq.media_inputs = self.media_inputs[prompt_index]
                self.sequences.append(seq)

    def hand_over_to(self, handover: Handover) -> None:
        """Its choices' tokens go to `handover` (a beam search's own, off the engine thread)."""
        for seq in self.sequences:
            seq.handover = handover

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

    def _check_limits(self, max_tokens: int, params: JobParams, prompts: list[Prompt] = (),
                      templates: TemplateSettings | None = None) -> None:
        limit = self.model.max_model_len
        for index, ids in enumerate(self.prompt_ids):
            if len(ids) + max_tokens > limit:
                parts = (conversation_parts(self.model.tokenizer, prompts[index], len(ids), templates)
                         if index < len(prompts) and templates is not None and self.media_inputs[index] is None
                         else None)
                raise JobError(400, context_error(limit, len(ids), max_tokens, parts.described() if parts else "",
                                                  self.model.context_capped_by),
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
        """Whether the engine is done with every choice (the output thread may still have some to say)."""
        return all(seq.finished for seq in self.sequences)

    @property
    def answered_in_full(self) -> bool:
        """Whether every choice's output has ended (the output thread's view)."""
        return all(seq.output.finished for seq in self.sequences)

    def started_message(self) -> Started:
        return {"type": protocol.STARTED, "model": self.model.model_id,
                "prompt_tokens": [len(ids) for ids in self.prompt_ids], "prompt_token_ids": self.prompt_ids,
                "max_model_len": self.model.max_model_len}

    def usage(self) -> Usage:
        cached: dict[int, int] = {}  # by prompt: its choices share one prefill
        for seq in self.sequences:
            cached[seq.prompt_index] = max(cached.get(seq.prompt_index, 0), seq.cached_prompt_tokens)
        return {"prompt_tokens": sum(len(ids) for ids in self.prompt_ids),
                "completion_tokens": sum(seq.output.billed for seq in self.sequences),
                "cached_tokens": sum(cached.values())}

    def due(self, stream_interval: int) -> bool:
        """Whether an answered, unfinished job's new deltas go out now: a streamed one's as they come, or
        once a choice holds `stream_interval` new tokens (SGLang's and vLLM's `--stream-interval`); a
        non-streamed one's never."""
        if not self.streamed:
            return False
        return stream_interval <= 1 or any(len(seq.output.pending_ids) >= stream_interval for seq in self.sequences)

    def take_deltas(self) -> list[ChoiceDelta]:
        return [delta for seq in self.sequences if (delta := seq.output.take_delta()) is not None]


def context_error(limit: int, prompt: int, max_tokens: int, parts: str = "", kv_capped: str = "") -> str:
    """What fits, said in the request's terms: the worker names the fields `prompt` and `max_tokens` in
    backticks, and the web side says them as the endpoint calls them (messages, max_completion_tokens…).
    `parts`: a conversation's split (prompt_parts), so tools and system prompt are counted apart; `kv_capped`:
    the setting whose KV cache budget holds no more of one sequence, where that, not the model's own context,
    is the limit."""
    said = f"This model's maximum context length is {limit} tokens"
    if kv_capped:
        said += f" (all its KV cache budget holds: {kv_capped})"
    if prompt >= limit:
        fits = f"shorten the `prompt` to at most {limit - max(max_tokens, 1)} tokens"
        if max_tokens > 1:
            fits += f" (or to {limit - 1} with a smaller `max_tokens`)"
        if parts:
            return (f"{said}, and the rendered conversation is {parts}: {fits}. Send fewer tools or messages, or "
                    "use a model with a longer context.")
        return (f"{said}, and the `prompt` alone is {prompt} tokens: {fits}. A chat's tools and system prompt count "
                "as prompt tokens; send fewer, or use a model with a longer context.")
    fits = f"set `max_tokens` to at most {limit - prompt}"
    if limit - max_tokens > 0:
        fits += f", or shorten the `prompt` to at most {limit - max_tokens} tokens"
    in_prompt = parts or f"{prompt}"
    return (f"{said}. However, you requested {prompt + max_tokens} tokens ({in_prompt} in your prompt and "
            f"{max_tokens} for the completion): {fits}.")
