"""How models are served, as an admin (or a server config file) decides: saved, then sent to every worker."""
from __future__ import annotations

import json

import protocol

from .. import selectors
from ..errors import ModelNotFound
from ..models import CachedModel
from .model_control import request_unload, send_to_all_workers


def broadcast_settings() -> None:
    """Every worker takes the whole settings map at once (no restart)."""
    selectors.forget_rules()
    send_to_all_workers(protocol.settings_message(selectors.model_settings_map()))


def save_model_settings(model: CachedModel) -> CachedModel:
    """Save settings an admin edited on the row and tell the workers."""
    model.save()
    broadcast_settings()
    return model


def configure_models(entries: list[dict]) -> list[str]:
    """A server config file's per-model settings onto the catalog (they replace the admin's for those keys).

    Each entry: {"name", "preload"?, "dtype"?, "device"?, "chat_template"? (template text),
    "stop"?, "generation_defaults"?, "idle_timeout"?, "aliases"?, "tool_parser"?, "reasoning_parser"?,
    "quantization"?, "trust_remote_code"?, "attn_implementation"?, "gguf_file"?, "speculative_config"? (vLLM's JSON,
    as text or an object), "tensor_parallel_size"?, "kv_cache_memory"? (8G or bytes)}; a model not in the cache
    is ModelNotFound.
    """
    configured = []
    for entry in entries:
        repo_id = selectors.canonical_repo_id(entry["name"])
        row = CachedModel.objects.filter(repo_id=repo_id, gone=False).first()
        if row is None:
            raise ModelNotFound(entry["name"])
        for key in ("preload", "dtype", "device", "chat_template", "idle_timeout", "aliases", "tool_parser",
                    "reasoning_parser", "quantization", "trust_remote_code", "attn_implementation", "gguf_file",
                    "speculative_config", "tensor_parallel_size", "kv_cache_memory"):
            if key in entry:
                value = entry[key]
                if key == "speculative_config" and isinstance(value, dict):
                    value = json.dumps(value)
                setattr(row, key, str(value) if key == "kv_cache_memory" else value)
        if "generation_defaults" in entry or "stop" in entry:
            stop = {"stop": entry["stop"]} if entry.get("stop") else {}
            row.generation_defaults = {**(entry.get("generation_defaults") or {}), **stop}
        row.full_clean()
        row.save()
        configured.append(repo_id)
    broadcast_settings()
    return configured


def set_enabled(models, enabled: bool) -> int:
    count = CachedModel.objects.filter(pk__in=[m.pk for m in models]).update(enabled=enabled)
    broadcast_settings()
    if not enabled:
        for model in models:
            request_unload(protocol.ModelRef(model.repo_id), "admin:disable")
    return count


def set_idle_timeout(models, seconds: int | None) -> int:
    count = CachedModel.objects.filter(pk__in=[m.pk for m in models]).update(idle_timeout=seconds)
    broadcast_settings()
    return count
