"""Messages between the web side and workers over the channel layer, each declared once here.

On the wire every message is a plain dict (msgpack-safe for channels-redis); the TypedDicts
below say what each one holds, and `JobParams` declares every sampling default of the request
path. Views and the worker consumer both import this module; it imports neither Django nor torch.

Web -> worker (on the shared worker channel):   SubmitMessage (its prompts: Prompt, its params: JobParams)
Web -> all workers (group):                     CancelMessage
Worker -> web (on the reply channel), in order: AcceptedMessage, then Started or ErrorMessage,
                                                DeltaMessage (once per step), DoneMessage;
                                                AliveMessage whenever it would be silent for a while
Worker -> worker it passed a job to and back:   SubmitMessage (routed), RouteAckMessage
Model control (web/admin -> a worker's channel, the shared worker channel, or the group):
    ControlMessage (model.load: one worker takes it; model.unload: every worker), SettingsMessage
Worker -> the control request's reply channel:  ControlAccepted, then ProgressMessage until its
                                                ModelEvent is terminal (`is_terminal`)
Engine -> its own worker's catalog bookkeeping: ModelChange
Health (web -> all workers, group), answered on its reply channel: PingMessage -> PongMessage
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, Mapping, NotRequired, TypedDict

SUBMIT = "generation.submit"
CANCEL = "generation.cancel"
ACCEPTED = "generation.accepted"
STARTED = "generation.started"
ERROR = "generation.error"
DELTA = "generation.delta"
DONE = "generation.done"
ALIVE = "generation.alive"
ROUTE_ACK = "generation.route_ack"
MODEL_LOAD = "model.load"
MODEL_UNLOAD = "model.unload"
MODEL_SETTINGS = "model.settings"
MODEL_ACCEPTED = "model.accepted"
MODEL_PROGRESS = "model.progress"
# ModelChange types: what a worker's model manager did, for the catalog.
MODEL_LOADING = "model.loading"
MODEL_LOADED = "model.loaded"
MODEL_LOAD_FAILED = "model.load_failed"
MODEL_UNLOADED = "model.unloaded"
PING = "worker.ping"
PONG = "worker.pong"
LOAD_STAGES = ("processor", "config", "download", "weights")

DEFAULT_REVISION = "main"


@dataclass(frozen=True)
class ModelRef:
    """A model name split once: `repo`, `repo@main` and `repo@<commit>`.

    `str(ref)` is the name as written (what a response echoes); `key` is how every map
    names the model, so `repo` and `repo@main` are one model.
    """

    repo_id: str
    revision: str | None = None  # None: written without one (the default branch)

    @classmethod
    def parse(cls, name: str) -> ModelRef:
        repo_id, _, revision = name.partition("@")
        return cls(repo_id, revision or None)

    @property
    def branch(self) -> str:
        """The revision to load: the one written, else the default branch."""
        return self.revision or DEFAULT_REVISION

    @property
    def key(self) -> str:
        return f"{self.repo_id}@{self.branch}"

    def __str__(self) -> str:
        return self.repo_id if self.revision is None else f"{self.repo_id}@{self.revision}"


# --- a generation job ------------------------------------------------------------

class Structured(TypedDict):
    """A grammar a job's output must match; `type` says which one key holds it.

    json_schema: `schema` (json_object is {"type": "object"}); regex: `pattern`; choice: `choices`;
    grammar: `grammar` (Lark or GBNF); tool_call: `tools` [{"name", "parameters"}] (one call of one).
    """

    type: Literal["json_schema", "regex", "choice", "grammar", "tool_call"]
    schema: NotRequired[dict[str, Any]]
    pattern: NotRequired[str]
    choices: NotRequired[list[str]]
    grammar: NotRequired[str]
    tools: NotRequired[list[dict[str, Any]]]


@dataclass
class JobParams:
    """Sampling and output parameters of one job: every default of the request path, once.

    None for the six sampling knobs in NEUTRAL_SAMPLING means "the model's
    generation_config.json, else the neutral value" (resolved on the worker).
    """

    max_tokens: int | None = None  # None: the rest of the context after the prompt
    temperature: float | None = None
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
    structured: Structured | None = None  # a grammar the output must match (workers.grammars)
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

    @classmethod
    def from_wire(cls, params: Mapping[str, Any]) -> JobParams:
        unknown = set(params) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown job parameters: {sorted(unknown)}")
        return cls(**params)

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)


# Where neither the request nor generation_config.json sets a knob (transformers' own defaults).
NEUTRAL_SAMPLING: dict[str, float | int] = {
    "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "typical_p": 1.0, "repetition_penalty": 1.0,
}
# Request fields every generation endpoint shares, named as in JobParams.
SHARED_REQUEST_FIELDS = (
    "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
    "no_repeat_ngram_size", "logit_bias", "seed", "n", "stop", "ignore_eos", "min_tokens",
    "typical_p", "bad_words", "bad_words_ids", "min_length", "num_beams", "length_penalty", "early_stopping",
    "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens",
    "truncate_prompt_tokens", "allowed_token_ids", "return_tokens_as_token_ids", "prompt_logprobs",
    "priority_class", "priority",
)


def to_job_params(request: Mapping[str, Any], **endpoint: Any) -> JobParams:
    """A validated request as job parameters (as vLLM's `to_sampling_params`).

    The shared sampling fields are read by name (absent or null: JobParams' default); the
    endpoint passes the fields it names its own way (`max_tokens`, `logprobs`, `echo`, `suffix`).
    """
    shared = {name: request[name] for name in SHARED_REQUEST_FIELDS if request.get(name) is not None}
    return JobParams(**shared, **endpoint)


class MediaPart(TypedDict):
    """An image, video or audio part of a user message's content list (the others: {"type": "text", "text"}).

    The worker reads `url` (data: or http(s)) into `data` bytes before its engine sees the job
    (workers.media_prompts); a video part is then also told how many `frames` to become.
    """

    type: Literal["image", "video", "audio"]
    url: str
    format: NotRequired[Literal["wav", "mp3"]]  # audio


class Conversation(TypedDict):
    """A chat prompt, rendered by the worker's chat template (workers.chat_templates), or by the
    model's processor when a message holds MediaParts (workers.media_prompts)."""

    messages: list[dict]
    tools: list[dict] | None
    chat_template_kwargs: dict[str, Any]
    add_generation_prompt: bool
    continue_final_message: bool
    documents: NotRequired[list[dict] | None]  # RAG templates' `documents` (vLLM's chat extra)
    truncate_to_fit: NotRequired[bool]  # Responses' truncation "auto": drop the oldest turns to fit the context


class TextPrompt(TypedDict):
    """Raw text with tokenizer options (/tokenize)."""

    text: str
    add_special_tokens: bool


class TokenIdsPrompt(TypedDict):
    """Token ids whose echo keeps special tokens (/detokenize)."""

    token_ids: list[int]


class AudioPrompt(TypedDict):
    """Audio for a speech-to-text model (/v1/audio/transcriptions and /translations; workers.transcription).

    Each ChoiceDelta of such a job is the text of one window of `window_seconds` (Started), in order.
    """

    audio: bytes  # the uploaded file as sent (wav, mp3, … anything FFmpeg reads)
    task: Literal["transcribe", "translate"]
    language: str | None  # ISO-639-1; None: the model detects it
    prompt: str | None
    word_timestamps: NotRequired[bool]  # each window's ChoiceDelta carries its `words`


Prompt = str | list[int] | Conversation | TextPrompt | TokenIdsPrompt | AudioPrompt


class SubmitMessage(TypedDict):
    type: Literal["generation.submit"]
    request_id: str
    reply_channel: str
    model: str
    prompts: list[Prompt]
    params: dict[str, Any]  # JobParams.to_wire()
    routed: NotRequired[bool]  # passed on once by another worker (or re-sent by the web); never again
    route_ack: NotRequired[str]  # the passing worker's channel, told at once that the job arrived
    accept_by: NotRequired[float]  # wall-clock time after which the web side no longer waits: drop it


class RouteAckMessage(TypedDict):
    """A routed job arrived; without this within ROUTE_ACK_TIMEOUT the passing worker runs it itself."""

    type: Literal["generation.route_ack"]
    request_id: str


class AliveMessage(TypedDict):
    """The worker still holds the job: sent on a reply channel that has heard nothing for a while
    (a job queued, or waiting for its model), so a silent reply channel means a dead worker."""

    type: Literal["generation.alive"]


class CancelMessage(TypedDict):
    type: Literal["generation.cancel"]
    request_id: str


class AcceptedMessage(TypedDict):
    type: Literal["generation.accepted"]
    worker: str


class Started(TypedDict):
    type: Literal["generation.started"]
    model: str
    prompt_tokens: list[int]  # per prompt
    prompt_token_ids: list[list[int]]
    max_model_len: int
    open_blocks: list[str]  # per dict prompt: the unclosed "<think>…"/"<tool_call>…" it ends in, or ""
    audio_seconds: NotRequired[float]  # an AudioPrompt's length
    window_seconds: NotRequired[int]  # an AudioPrompt is transcribed in windows this long
    language: NotRequired[str]  # an AudioPrompt's language, named ("english"): asked for or detected


class ErrorMessage(TypedDict):
    type: Literal["generation.error"]
    status: int
    message: str
    param: str | None
    code: str | None
    retry_after: int | None


class Logprobs(TypedDict):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class PromptLogprob(TypedDict):
    """One prompt token scored (vLLM's prompt_logprobs entry, before the web side keys it by id);
    the first token has nothing before it: logprob and rank None, no alternatives."""

    token_id: int
    token: str
    logprob: float | None
    rank: int | None  # 1: the most likely token there
    top: list[list]  # [[token_id, token text, logprob], ...] most likely first


class Word(TypedDict):
    """A transcribed word and when it is said, in seconds from the start of the audio."""

    word: str
    start: float
    end: float


class ChoiceDelta(TypedDict):
    """What one choice produced in one step."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: Logprobs | None
    finish_reason: str | None
    words: NotRequired[list[Word]]  # a transcription window's, where an AudioPrompt asked for word_timestamps
    prompt_logprobs: NotRequired[list[PromptLogprob]]  # on a choice's first delta, when the job asked


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int


class DeltaMessage(TypedDict):
    type: Literal["generation.delta"]
    choices: list[ChoiceDelta]


class DoneMessage(TypedDict):
    type: Literal["generation.done"]
    choices: list[ChoiceDelta]
    usage: Usage


def submit_message(request_id: str, reply_channel: str, model: str, prompts: list[Prompt],
                   params: JobParams) -> SubmitMessage:
    return {"type": SUBMIT, "request_id": request_id, "reply_channel": reply_channel, "model": model,
            "prompts": prompts, "params": params.to_wire()}


def is_stale(job: SubmitMessage, now: float) -> bool:
    """A job its web side gave up on (it answered 503 no_worker): nobody reads its reply channel."""
    return now > job.get("accept_by", now)


def cancel_message(request_id: str) -> CancelMessage:
    return {"type": CANCEL, "request_id": request_id}


def error_message(status: int, message: str, param: str | None = None, code: str | None = None,
                  retry_after: int | None = None) -> ErrorMessage:
    return {"type": ERROR, "status": status, "message": message, "param": param, "code": code,
            "retry_after": retry_after}


# --- model control ----------------------------------------------------------------

class ModelSettings(TypedDict):
    """One model's catalog settings as workers take them (the whole map replaces the last one)."""

    enabled: bool
    idle_timeout: int | None
    preload: bool
    dtype: str
    device: str
    chat_template: str
    generation_defaults: dict[str, Any]


class ControlMessage(TypedDict):
    type: Literal["model.load", "model.unload"]
    model: str  # ModelRef.key
    reply_channel: str | None
    requested_by: str


class SettingsMessage(TypedDict):
    type: Literal["model.settings"]
    settings: dict[str, ModelSettings]  # by repo id


class ControlAccepted(TypedDict):
    type: Literal["model.accepted"]
    worker: str


class ModelEvent(TypedDict):
    """One step of a load or unload, exactly /load_model's SSE payload.

    {"status": "loading", "model", "stage", "progress"?} then {"status": "ready", "model", "cached"}
    or {"status": "error", "model", "message", "code"}; an unload ends "unloaded" or "not_loaded".
    """

    status: Literal["loading", "ready", "error", "unloaded", "not_loaded"]
    model: str
    stage: NotRequired[str]
    progress: NotRequired[dict[str, int]]
    cached: NotRequired[bool]
    message: NotRequired[str]
    code: NotRequired[str]


class ProgressMessage(TypedDict):
    type: Literal["model.progress"]
    worker: str
    event: ModelEvent


class ModelChange(TypedDict):
    """A load or unload a worker's model manager did, for the catalog's records."""

    type: Literal["model.loading", "model.loaded", "model.load_failed", "model.unloaded"]
    model: str
    requested_by: str
    duration_s: NotRequired[float]
    error: NotRequired[str]
    memory_bytes: NotRequired[int]


def control_message(kind: str, model: str, reply_channel: str | None = None, requested_by: str = "") -> ControlMessage:
    """A model.load / model.unload request."""
    if kind not in (MODEL_LOAD, MODEL_UNLOAD):
        raise ValueError(f"not a model control message: {kind}")
    return {"type": kind, "model": model, "reply_channel": reply_channel, "requested_by": requested_by}


def progress_message(worker: str, event: ModelEvent) -> ProgressMessage:
    return {"type": MODEL_PROGRESS, "worker": worker, "event": event}


def is_terminal(event: ModelEvent) -> bool:
    """Whether a model.progress event ends its stream."""
    return event.get("status") in ("ready", "error", "unloaded")


class PingMessage(TypedDict):
    """/health asks every worker; any answer shows one is reachable over the channel layer."""

    type: Literal["worker.ping"]
    reply_channel: str


class PongMessage(TypedDict):
    type: Literal["worker.pong"]
    worker: str


def ping_message(reply_channel: str) -> PingMessage:
    return {"type": PING, "reply_channel": reply_channel}
