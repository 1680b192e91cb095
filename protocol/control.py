"""Model control and health on the wire: loads, unloads, settings, progress, ping."""
from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from protocol.model_ref import ModelRef, ModelRefDict

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
MODEL_HEALTH = "model.health"  # a model became degraded on a worker, or recovered (ModelHealthChange)
PING = "worker.ping"
PONG = "worker.pong"
LOAD_STAGES = ("processor", "config", "download", "weights")


class ModelSettings(TypedDict):
    """One model's catalog settings as workers take them (the whole map replaces the last one)."""

    enabled: bool
    idle_timeout: int | None
    preload: bool
    dtype: str
    device: str
    chat_template: str
    generation_defaults: dict[str, Any]
    tool_parser: NotRequired[str]  # "": what the model's files say (protocol.output_formats)
    reasoning_parser: NotRequired[str]
    quantization: str  # protocol.load_options; "": the worker's default
    trust_remote_code: bool
    attn_implementation: str
    gguf_file: NotRequired[str]  # a GGUF model's file (protocol/gguf.py); "": its default one
    speculative_config: NotRequired[str]  # protocol/speculative.py: vLLM's JSON, "off", or "": the server's
    tensor_parallel_size: NotRequired[int]  # ranks the model is split over; 0: the worker's default
    kv_cache_memory: NotRequired[str]  # its KV cache budget (protocol/sizes.py: 8G, bytes); "": the worker's


class ControlMessage(TypedDict):
    type: Literal["model.load", "model.unload"]
    model: ModelRefDict
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
    max_model_len: NotRequired[int]  # the context it serves there (its KV cache budget may cap the model's own)


class ModelHealthChange(TypedDict):
    """A model's recent jobs on a worker turned it degraded (most failed) or back, for the catalog at once
    (its heartbeat carries the same record for every model it holds: {model@rev: {degraded, failed, of,
    last_error}})."""

    type: Literal["model.health"]
    model: str
    degraded: bool
    failed: int  # of the last `of` jobs ended
    of: int
    last_error: str


def model_health_change(model: str, record: dict) -> ModelHealthChange:
    """`record`: {degraded, failed, of, last_error} (workers/adapter/model_health.py)."""
    return {"type": MODEL_HEALTH, "model": model, "degraded": bool(record["degraded"]),
            "failed": int(record["failed"]), "of": int(record["of"]), "last_error": str(record["last_error"])}


def control_message(kind: str, model: ModelRef, reply_channel: str | None = None, requested_by: str = "") -> ControlMessage:
    """A model.load / model.unload request."""
    if kind not in (MODEL_LOAD, MODEL_UNLOAD):
        raise ValueError(f"not a model control message: {kind}")
    return {"type": kind, "model": model.to_wire(), "reply_channel": reply_channel, "requested_by": requested_by}


def settings_message(settings: dict[str, ModelSettings]) -> SettingsMessage:
    return {"type": MODEL_SETTINGS, "settings": settings}


def control_accepted(worker: str) -> ControlAccepted:
    return {"type": MODEL_ACCEPTED, "worker": worker}


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
    problem: NotRequired[str | None]  # why this worker cannot serve (its engine dead or stalled), else None
    degraded: NotRequired[dict]  # models failing most of their recent jobs here, with the last error


def ping_message(reply_channel: str) -> PingMessage:
    return {"type": PING, "reply_channel": reply_channel}


def pong_message(worker: str, problem: str | None = None, degraded: dict | None = None) -> PongMessage:
    """`degraded`: {model: {"failed", "of", "last_error"}}, the models failing most of their recent jobs."""
    return {"type": PONG, "worker": worker, "problem": problem, "degraded": degraded or {}}
