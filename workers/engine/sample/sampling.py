"""Per-request sampling: OpenAI's parameters plus Hugging Face's, one sequence at a time.

Hugging Face's own logits processors give the HF extras their exact HF meaning;
OpenAI's presence/frequency penalties and logit_bias are applied as OpenAI
defines them (over the completion's tokens only).
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from protocol import NEUTRAL_SAMPLING, JobParams

# Keys of generation_config.json that supply defaults where a request is silent: the sampling knobs, whether
# to sample at all, and the completion's length (a request without max_tokens).
MODEL_DEFAULT_KEYS = (*NEUTRAL_SAMPLING, "do_sample", "max_new_tokens")


@dataclass
class SamplingParams:
    """A job's sampling knobs resolved for one model (JobParams declares their defaults)."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    typical_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    no_repeat_ngram_size: int
    bad_words_ids: list[list[int]]
    logit_bias: dict[int, float]
    seed: int | None
    ignore_eos: bool
    min_tokens: int
    logprobs: int | None
    allowed_token_ids: list[int] | None = None

    @classmethod
    def from_job(cls, params: JobParams, model_defaults: dict) -> "SamplingParams":
        """Request values win; then generation_config.json; then the neutral values."""
        chosen = {}
        for key, neutral in NEUTRAL_SAMPLING.items():
            value = getattr(params, key)
            value = model_defaults.get(key) if value is None else value
            chosen[key] = neutral if value is None else value
        do_sample = params.do_sample
        if do_sample is None and params.temperature is None:  # a request that asks nothing of sampling
            do_sample = model_defaults.get("do_sample")
        if do_sample is False:
            chosen["temperature"] = 0.0
        return cls(
            temperature=float(chosen["temperature"]),
            top_p=float(chosen["top_p"]),
            top_k=max(int(chosen["top_k"]), 0),  # -1: no top-k
            min_p=float(chosen["min_p"]),
            typical_p=float(chosen["typical_p"]),
            repetition_penalty=float(chosen["repetition_penalty"] or NEUTRAL_SAMPLING["repetition_penalty"]),
            presence_penalty=float(params.presence_penalty),
            frequency_penalty=float(params.frequency_penalty),
            no_repeat_ngram_size=int(params.no_repeat_ngram_size),
            bad_words_ids=[list(ids) for ids in params.bad_words_ids],
            logit_bias={int(k): float(v) for k, v in (params.logit_bias or {}).items()},
            seed=params.seed,
            ignore_eos=params.ignore_eos,
            min_tokens=int(params.min_tokens),
            logprobs=params.logprobs,
            allowed_token_ids=list(params.allowed_token_ids) if params.allowed_token_ids else None,
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


@dataclass
class TokenChoice:
    token_id: int
    logprob: float | None
    top: list[tuple[int, float]]


class Sampler:
    """Chooses the next token of one sequence from the model's logits for it."""

    def __init__(self, params: SamplingParams, eos_token_ids: list[int], device: torch.device, seed_offset: int) -> None:
        self.params = params
        self.eos_token_ids = eos_token_ids
        self.generator: torch.Generator | None = None
        if not params.greedy:
            seed = params.seed + seed_offset if params.seed is not None else secrets.randbits(63)
            self.generator = torch.Generator(device=device).manual_seed(seed % (2**63))
        self.processors = []
        if params.repetition_penalty != 1.0:
            self.processors.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
        if params.no_repeat_ngram_size > 0:
            self.processors.append(NoRepeatNGramLogitsProcessor(params.no_repeat_ngram_size))
        if params.bad_words_ids:
            self.processors.append(NoBadWordsLogitsProcessor(params.bad_words_ids, eos_token_ids or None))
        self.allowed: torch.Tensor | None = None  # vLLM's allowed_token_ids as a [vocab] mask, built on first use
        self.warpers = []
        if not params.greedy:
            if params.top_k > 0:
                self.warpers.append(TopKLogitsWarper(params.top_k))
            if params.top_p < 1.0:
                self.warpers.append(TopPLogitsWarper(params.top_p))
            if params.min_p > 0.0:
                self.warpers.append(MinPLogitsWarper(params.min_p))
            if params.typical_p < 1.0:
                self.warpers.append(TypicalLogitsWarper(params.typical_p))

    @property
    def batchable(self) -> bool:
        """Whether a batch's sampling columns (workers/engine/sample/batch_sampling.py) take this row with the
        others, penalties and a logit bias included (workers/engine/sample/penalties.py); n-gram bans, bad
        words, an allowed-token set and typical-p go through `choose`, one row at a time."""
        params = self.params
        return not (params.no_repeat_ngram_size > 0 or params.bad_words_ids or params.allowed_token_ids
                    or (not params.greedy and params.typical_p < 1.0))

    def choose(self, logits: torch.Tensor, prompt_ids: list[int], completion_ids: list[int],
               allowed: torch.Tensor | None = None) -> TokenChoice | None:
        """logits: the model's [vocab] scores for the next token of this sequence; `allowed`: the
        grammar's [vocab] mask, if constrained. None when nothing is left to choose (a grammar dead end)."""
        params = self.params
        logits = logits.float()
        scores = logits.unsqueeze(0).clone()
        all_ids = torch.tensor([prompt_ids + completion_ids], device=scores.device) if self.processors else None
        for processor in self.processors:
            scores = processor(all_ids, scores)
        if completion_ids and (params.presence_penalty or params.frequency_penalty):
            counts = torch.bincount(torch.tensor(completion_ids, device=scores.device), minlength=scores.shape[-1])
            counts = counts[: scores.shape[-1]].to(scores.dtype)
            scores -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(scores.dtype)
        if params.logit_bias:
            ids = torch.tensor(list(params.logit_bias), device=scores.device)
            scores[0, ids] += torch.tensor(list(params.logit_bias.values()), device=scores.device, dtype=scores.dtype)
        if self.eos_token_ids and (params.ignore_eos or len(completion_ids) < params.min_tokens):
            scores[0, self.eos_token_ids] = -float("inf")
        if params.allowed_token_ids:
            if self.allowed is None or self.allowed.shape[0] != scores.shape[-1]:
                self.allowed = torch.zeros(scores.shape[-1], dtype=torch.bool, device=scores.device)
                self.allowed[torch.tensor(params.allowed_token_ids, device=scores.device)] = True
            allowed = self.allowed if allowed is None else allowed.to(scores.device) & self.allowed
        if allowed is not None:
            scores[0].masked_fill_(~allowed.to(scores.device), -float("inf"))
            if not bool(torch.isfinite(scores).any()):
                return None
        if params.greedy:
            token_id = int(torch.argmax(scores[0]))
        else:
            scores = scores / params.temperature
            for warper in self.warpers:
                scores = warper(all_ids, scores)
            probs = torch.softmax(scores[0], dim=-1)
            token_id = int(torch.multinomial(probs, 1, generator=self.generator))
        return self._with_logprobs(logits, token_id)

    def _with_logprobs(self, logits: torch.Tensor, token_id: int) -> TokenChoice:
        if self.params.logprobs is None:
            return TokenChoice(token_id, None, [])
        return token_logprobs(logits, token_id, self.params.logprobs)


LOWEST_LOGPROB = -9999.0  # what a token the model rules out (a logprob of -inf) is reported as, as vLLM does


def reported(logprobs: torch.Tensor) -> torch.Tensor:
    """Logprobs as a response reports them: -inf (a token the model's own scores rule out) as LOWEST_LOGPROB,
    a number JSON can carry (JSON has no infinity: it would reach the client as null, or as invalid JSON)."""
    return logprobs.clamp(min=LOWEST_LOGPROB)


def token_logprobs(logits: torch.Tensor, token_id: int, top_n: int) -> TokenChoice:
    """The model's own log-probabilities (before any penalty or warping), as vLLM reports them."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    top: list[tuple[int, float]] = []
    if top_n > 0:
        values, indices = torch.topk(logprobs, top_n)
        top = [(int(i), float(v)) for i, v in zip(indices, reported(values))]
    return TokenChoice(token_id, float(reported(logprobs[token_id])), top)
