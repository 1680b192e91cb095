"""A job's sampling and output parameters: every default of the request path, declared once."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal, Mapping, NotRequired, TypedDict


class Structured(TypedDict):
    """A grammar a job's output must match; `type` says which one key holds it.

    json_schema: `schema` (json_object is {"type": "object"}); regex: `pattern`; choice: `choices`;
    grammar: `grammar` (Lark or GBNF); tool_call: `tools` [{"name", "parameters"}] (one call of one, or
    `many`: one or more), which the worker writes in the model's own tool-call syntax (`syntax`).
    """

    type: Literal["json_schema", "regex", "choice", "grammar", "tool_call"]
    schema: NotRequired[dict[str, Any]]
    pattern: NotRequired[str]
    choices: NotRequired[list[str]]
    grammar: NotRequired[str]
    tools: NotRequired[list[dict[str, Any]]]
    many: NotRequired[bool]
    syntax: NotRequired[str]


@dataclass
class JobParams:
    """Sampling and output parameters of one job: every default of the request path, once.

    None for the six sampling knobs in NEUTRAL_SAMPLING means "the model's
    generation_config.json, else the neutral value" (resolved on the worker).
    """

    max_tokens: int | None = None  # None: the rest of the context after the prompt
    temperature: float | None = None
    do_sample: bool | None = None  # False: greedy; None: sample, unless the request sets no temperature and the
    # model's generation_config.json says do_sample false (then greedy, as transformers' generate)
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    no_repeat_ngram_size: int = 0
    typical_p: float | None = None
    bad_words: list[str] = field(default_factory=list)  # strings never generated
    bad_words_ids: list[list[int]] = field(default_factory=list)  # token sequences never generated
    min_length: int = 0  # Hugging Face's: prompt + completion tokens before EOS may come
    num_beams: int = 1  # > 1: beam search (Hugging Face's generate), beside the continuous batch
    length_penalty: float = 1.0
    early_stopping: bool | str = False  # True, False or "never", as Hugging Face's
    structured: Structured | None = None  # a grammar the output must match (workers.engine.sample.grammars)
    # Chat and Responses: the answer split into reasoning, content and tool calls as the model's family
    # writes them (ChoiceDelta.parts; workers/engine/output/parsing), tool calls read when `parse_tools`.
    parse_output: bool = False
    parse_tools: bool = False
    parallel_tool_calls: bool = True  # False: an answer's first call only
    ban_tool_calls: bool = False  # tool_choice "none": the family's tool-call markers are never generated
    logit_bias: dict[str, float] | None = None  # {token id (str): bias}
    seed: int | None = None
    n: int = 1
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None  # None, or 0..20 top alternatives per token
    echo: bool = False
    suffix: str | None = None
    # vLLM's extras, with vLLM's meaning (docs/api-parameters.md).
    stop_token_ids: list[int] = field(default_factory=list)  # a generated id in here ends the choice ("stop")
    include_stop_str_in_output: bool = False  # the stop string (or stop token's text) stays in the text
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None  # keep only the prompt's last N tokens (-1: the context)
    allowed_token_ids: list[int] | None = None  # every generated token is one of these
    return_tokens_as_token_ids: bool = False  # logprobs name tokens "token_id:<id>"
    prompt_logprobs: int | None = None  # score the prompt's tokens, with this many alternatives each
    # Scheduling: the fair-share scheduler's class ("interactive" or "batch"; OpenAI's service_tier
    # "flex" and vLLM's priority > 0 are batch), and vLLM's priority number as sent (lower: sooner).
    priority_class: Literal["interactive", "batch"] = "interactive"
    priority: int = 0
    prompt_cache_key: str | None = None  # OpenAI's: requests sharing it go to the same worker (its prefix cache)
    stream: bool = True  # False: the client reads the whole answer at once, so the worker sends its first
    # token (time to first token is still measured) and then the rest when done, not a message per step

    @classmethod
    def from_wire(cls, params: Mapping[str, Any]) -> JobParams:
        unknown = set(params) - set(_FIELD_NAMES)
        if unknown:
            raise ValueError(f"unknown job parameters: {sorted(unknown)}")
        return cls(**params)

    def to_wire(self) -> dict[str, Any]:
        """Its fields as they are (no deep copy, as `asdict` makes: a job's params are its own)."""
        return {name: getattr(self, name) for name in _FIELD_NAMES}


# The sampling knobs a model may set defaults for (its generation_config.json, an admin's catalog
# row, a config file's `generation_defaults`), each with the value it takes where neither the
# request nor the model sets it (transformers' own defaults). The one list: the catalog, the
# config files and the worker's sampler all read it from here.
NEUTRAL_SAMPLING: dict[str, float | int] = {
    "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "typical_p": 1.0, "repetition_penalty": 1.0,
}
MODEL_SAMPLING_KEYS: tuple[str, ...] = tuple(NEUTRAL_SAMPLING)
# Request fields every generation endpoint shares, named as in JobParams.
SHARED_REQUEST_FIELDS = (
    "temperature", "do_sample", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
    "no_repeat_ngram_size", "logit_bias", "seed", "n", "stop", "ignore_eos", "min_tokens",
    "typical_p", "bad_words", "bad_words_ids", "min_length", "num_beams", "length_penalty", "early_stopping",
    "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens",
    "truncate_prompt_tokens", "allowed_token_ids", "return_tokens_as_token_ids", "prompt_logprobs",
    "priority_class", "priority", "prompt_cache_key",
)


def rest_of_context(prompt_lengths: list[int], max_model_len: int | None) -> int:
    """The completion a job without `max_tokens` may have (as vLLM): what the context leaves after its
    longest prompt (every choice of every prompt gets the same). Unknown context length: 0. The worker
    generates up to it and the team limiter reserves it, so both count the same."""
    if max_model_len is None or not prompt_lengths:
        return 0
    return max(max_model_len - max(prompt_lengths), 0)


def to_job_params(request: Mapping[str, Any], **endpoint: Any) -> JobParams:
    """A validated request as job parameters (as vLLM's `to_sampling_params`).

    The shared sampling fields are read by name (absent or null: JobParams' default); the
    endpoint passes the fields it names its own way (`max_tokens`, `logprobs`, `echo`, `suffix`).
    """
    shared = {name: request[name] for name in SHARED_REQUEST_FIELDS if request.get(name) is not None}
    endpoint.setdefault("stream", bool(request.get("stream", True)))
    return JobParams(**shared, **endpoint)


_FIELD_NAMES = tuple(f.name for f in fields(JobParams))
