"""Messages between the web side and workers over the channel layer.

Plain dicts (msgpack-safe for channels-redis). Views and the worker consumer
both import this module; it imports neither Django views nor torch.

Web -> worker (on the shared worker channel):
    {"type": "generation.submit", "request_id", "reply_channel", "model",
     "prompts": [str | [int] | dict], "params": {...}}
    A dict prompt is rendered on the worker (workers.chat_templates), either a conversation
    {"messages": [...], "tools": [...] | None, "chat_template_kwargs": {...},
     "add_generation_prompt": bool, "continue_final_message": bool}
    or raw text with tokenizer options {"text": str, "add_special_tokens": bool},
    or token ids whose echo keeps special tokens {"token_ids": [int]}.
Web -> all workers (group):
    {"type": "generation.cancel", "request_id"}
Worker -> web (on the reply channel), in this order:
    {"type": "generation.accepted", "worker": name}
    {"type": "generation.started", "model", "prompt_tokens": [int per prompt],
     "prompt_token_ids": [[int] per prompt], "max_model_len": int,
     "open_blocks": [str per dict prompt: the unclosed "<think>…"/"<tool_call>…" it ends in, or ""]}
        or {"type": "generation.error", "status", "message", "param", "code"}
    {"type": "generation.delta", "choices": [ChoiceDelta...]}   (once per step)
    {"type": "generation.done", "usage": {"prompt_tokens", "completion_tokens"}}
Model control (web/admin -> a worker's channel, the shared worker channel, or the group):
    {"type": "model.load", "model": "repo@rev", "reply_channel": str | None, "requested_by": str}
        on the shared channel one worker takes it; on a worker's own channel that worker.
    {"type": "model.unload", "model": "repo@rev", "reply_channel": str | None, "requested_by": str}
    {"type": "model.settings", "settings": {repo_id: ModelSettings}}   (group: every worker)
    ModelSettings is {"enabled", "idle_timeout": int | None, "preload", "dtype", "device",
    "chat_template", "generation_defaults"}; the whole map, replacing the last one.
Worker -> the control request's reply channel:
    {"type": "model.accepted", "worker": name}
    {"type": "model.progress", "event": LoadEvent}   (until one with status ready/error)
    LoadEvent is exactly /load_model's SSE payload: {"status": "loading", "model", "stage",
    "progress"?} then {"status": "ready", "model", "cached"} or {"status": "error", "model",
    "message", "code"}; an unload ends with {"status": "unloaded", "model"} or an error.
A ChoiceDelta is {"index", "text", "token_ids", "logprobs", "finish_reason"}
where logprobs is None or {"tokens", "token_logprobs", "top_logprobs", "text_offset"}.
"""
from __future__ import annotations

SUBMIT = "generation.submit"
CANCEL = "generation.cancel"
ACCEPTED = "generation.accepted"
STARTED = "generation.started"
ERROR = "generation.error"
DELTA = "generation.delta"
DONE = "generation.done"
MODEL_LOAD = "model.load"
MODEL_UNLOAD = "model.unload"
MODEL_SETTINGS = "model.settings"
MODEL_ACCEPTED = "model.accepted"
MODEL_PROGRESS = "model.progress"
LOAD_STAGES = ("processor", "config", "download", "weights")

# Sampling and output parameters a job may carry, with their neutral values.
PARAM_DEFAULTS: dict[str, object] = {
    "max_tokens": 16,  # None: the rest of the context after the prompt (chat's default)
    "temperature": None,  # None: the model's generation_config, else 1.0
    "top_p": None,
    "top_k": None,
    "min_p": None,
    "repetition_penalty": None,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "no_repeat_ngram_size": 0,
    "logit_bias": None,  # {token_id (str): bias}
    "seed": None,
    "n": 1,
    "stop": [],
    "ignore_eos": False,
    "min_tokens": 0,
    "logprobs": None,  # None or 0..5 top alternatives per token
    "echo": False,
    "suffix": None,
}


def submit_message(
    request_id: str, reply_channel: str, model: str, prompts: list, params: dict
) -> dict:
    unknown = set(params) - set(PARAM_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown job parameters: {sorted(unknown)}")
    return {
        "type": SUBMIT,
        "request_id": request_id,
        "reply_channel": reply_channel,
        "model": model,
        "prompts": prompts,
        "params": {**PARAM_DEFAULTS, **params},
    }


def error_message(status: int, message: str, param: str | None = None, code: str | None = None,
                  retry_after: int | None = None) -> dict:
    return {"type": ERROR, "status": status, "message": message, "param": param, "code": code,
            "retry_after": retry_after}


def control_message(kind: str, model: str, reply_channel: str | None = None, requested_by: str = "") -> dict:
    """A model.load / model.unload request."""
    if kind not in (MODEL_LOAD, MODEL_UNLOAD):
        raise ValueError(f"not a model control message: {kind}")
    return {"type": kind, "model": model, "reply_channel": reply_channel, "requested_by": requested_by}


def is_terminal(event: dict) -> bool:
    """Whether a model.progress event ends its stream."""
    return event.get("status") in ("ready", "error", "unloaded")
