"""A generation job on the wire: what the web side submits and what the worker streams back."""
from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from protocol.model_ref import ModelRef, ModelRefDict
from protocol.params import JobParams

SUBMIT = "generation.submit"
CANCEL = "generation.cancel"
ACCEPTED = "generation.accepted"
STARTED = "generation.started"
ERROR = "generation.error"
DELTA = "generation.delta"
DONE = "generation.done"
ALIVE = "generation.alive"
ROUTE_ACK = "generation.route_ack"


class MediaPart(TypedDict):
    """An image, video or audio part of a user message's content list (the others: {"type": "text", "text"}).

    The worker reads `url` (data: or http(s)) into `data` bytes before its engine sees the job
    (workers.engine.inputs.media_prompts); a video part is then also told how many `frames` to become.
    """

    type: Literal["image", "video", "audio"]
    url: str
    format: NotRequired[Literal["wav", "mp3"]]  # audio


class Conversation(TypedDict):
    """A chat prompt, rendered by the worker's chat template (workers.engine.inputs.chat_templates), or by the
    model's processor when a message holds MediaParts (workers.engine.inputs.media_prompts)."""

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
    """Audio for a speech-to-text model (/v1/audio/transcriptions and /translations; workers.engine.tasks.transcription).

    Each ChoiceDelta of such a job is the text of one window of `window_seconds` (Started), in order.
    """

    audio: bytes  # the uploaded file as sent (wav, mp3, … anything FFmpeg reads)
    task: Literal["transcribe", "translate"]
    language: str | None  # ISO-639-1; None: the model detects it
    prompt: str | None
    word_timestamps: NotRequired[bool]  # each window's ChoiceDelta carries its `words`


class EmbeddingPrompt(TypedDict):
    """One input of /v1/embeddings (workers.engine.tasks.embedding): text or token ids, pooled into one vector.

    Its ChoiceDelta carries the vector as `embedding` (no text, no tokens generated).
    """

    embed: str | list[int]
    dimensions: NotRequired[int | None]  # the first `dimensions` components, renormalised (Matryoshka models)


class PairPrompt(TypedDict):
    """One pair of /v1/score or /v1/rerank (workers.engine.tasks.pair_scoring): scored by a cross-encoder over the
    pair as the tokenizer's text pair, or by an embedding model as the cosine of the two texts' vectors.

    Its ChoiceDelta carries the number as `score`.
    """

    pair: list[str]  # [text_1, text_2]
    activation: NotRequired[bool | None]  # a cross-encoder's activation (sigmoid); False: the raw logit


Prompt = (str | list[int] | Conversation | TextPrompt | TokenIdsPrompt | AudioPrompt | EmbeddingPrompt
          | PairPrompt)


class TeamRef(TypedDict):
    """Whose job it is, for the engine's fair share (workers/engine/core/fair_share.py): the team's name and
    its weight (teams' `share`, > 0; equal shares get equal parts of a full box)."""

    name: str
    share: float


class SubmitMessage(TypedDict):
    type: Literal["generation.submit"]
    request_id: str
    reply_channel: str
    model: ModelRefDict  # resolved by the web side (catalog.selectors), never parsed again
    prompts: list[Prompt]
    params: dict[str, Any]  # JobParams.to_wire()
    routed: NotRequired[bool]  # passed on once by another worker (or re-sent by the web); never again
    route_ack: NotRequired[str]  # the passing worker's channel, told at once that the job arrived
    team: NotRequired[TeamRef]  # the team it counts against (absent: a job of no team, e.g. a test's)


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
    max_tokens: NotRequired[int]  # the completion's most tokens, resolved once by the worker (a generation job's)
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


class Part(TypedDict):
    """One piece of a chat answer as its family's parser split it (workers/engine/output/parsing), in order:
    "content" / "reasoning" text, a "tool_call" opening (its `index` among the answer's calls, `id`,
    `name`), then its "arguments" fragments (`index`, `text`; joined, the arguments' JSON)."""

    type: Literal["content", "reasoning", "tool_call", "arguments"]
    text: NotRequired[str]
    index: NotRequired[int]
    id: NotRequired[str]
    name: NotRequired[str]


class ChoiceDelta(TypedDict):
    """What one choice produced in one step."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: Logprobs | None
    finish_reason: str | None
    parts: NotRequired[list[Part]]  # a parsed (chat) job's: its text split by the model's format
    words: NotRequired[list[Word]]  # a transcription window's, where an AudioPrompt asked for word_timestamps
    prompt_logprobs: NotRequired[list[PromptLogprob]]  # on a choice's first delta, when the job asked
    embedding: NotRequired[list[float]]  # an EmbeddingPrompt's vector
    score: NotRequired[float]  # a PairPrompt's score


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: NotRequired[int]  # prompt tokens whose keys/values came from the prefix cache


class DeltaMessage(TypedDict):
    type: Literal["generation.delta"]
    choices: list[ChoiceDelta]


class DoneMessage(TypedDict):
    type: Literal["generation.done"]
    choices: list[ChoiceDelta]
    usage: Usage


def submit_message(request_id: str, reply_channel: str, model: ModelRef, prompts: list[Prompt],
                   params: JobParams, team: TeamRef | None = None) -> SubmitMessage:
    message: SubmitMessage = {"type": SUBMIT, "request_id": request_id, "reply_channel": reply_channel,
                              "model": model.to_wire(), "prompts": prompts, "params": params.to_wire()}
    if team is not None:
        message["team"] = {"name": str(team["name"]), "share": float(team["share"])}
    return message


def accepted_message(worker: str) -> AcceptedMessage:
    return {"type": ACCEPTED, "worker": worker}


def alive_message() -> AliveMessage:
    return {"type": ALIVE}


def route_ack_message(request_id: str) -> RouteAckMessage:
    return {"type": ROUTE_ACK, "request_id": request_id}


def delta_message(choices: list[ChoiceDelta]) -> DeltaMessage:
    return {"type": DELTA, "choices": choices}


def done_message(choices: list[ChoiceDelta], usage: Usage) -> DoneMessage:
    return {"type": DONE, "choices": choices, "usage": usage}


def routed_job(job: SubmitMessage, passed_by: str) -> SubmitMessage:
    """The job as passed on to the worker that holds its model (once: the receiver takes it)."""
    return {**job, "routed": True, "route_ack": passed_by}


def claim_key(request_id: str) -> str:
    """The layer key (after the layer's prefix) a job's first taker sets; a web side that gave up on the
    job (or cancelled it) sets it first, so no worker takes it later. No clock is compared anywhere."""
    return f"claim:{request_id}"


def cancel_message(request_id: str) -> CancelMessage:
    return {"type": CANCEL, "request_id": request_id}


SHUTTING_DOWN = "The server is shutting down: this request was ended before it finished. Retry it."


def shutting_down_message() -> ErrorMessage:
    """What a graceful stop tells a job it ends (web side or worker side): a 503 the client may retry."""
    return error_message(503, SHUTTING_DOWN, None, "server_shutting_down", retry_after=1)


def error_message(status: int, message: str, param: str | None = None, code: str | None = None,
                  retry_after: int | None = None) -> ErrorMessage:
    return {"type": ERROR, "status": status, "message": message, "param": param, "code": code,
            "retry_after": retry_after}
