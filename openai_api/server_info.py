"""`GET /version` and `GET /tokenizer_info` (vLLM's), and what `/v1/models` reads from a model's files.

Read from the model's files in the Hugging Face cache (its config.json and tokenizer_config.json):
no worker and no tokenizer is needed to answer.
"""
from __future__ import annotations

import json
from pathlib import Path

from channels.db import database_sync_to_async
from django.conf import settings
from rest_framework.response import Response

from catalog.errors import ModelNotFound
from catalog.hf_cache import CacheEntry
from catalog.selectors import canonical_repo_id, listed_models
from protocol.context_length import context_length

from .base import OpenAIView

VERSION = "0.28.0"  # this server's API version, as /version reports it (vLLM's shape)


def _json_file(path: Path) -> dict:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def config_max_model_len(snapshot: Path) -> int:
    """The context length the worker will use (protocol.context_length, read from the snapshot's files)."""
    return context_length(_json_file(snapshot / "config.json"),
                          _json_file(snapshot / "tokenizer_config.json").get("model_max_length"))


def served_context_length(own: int) -> int:
    """A model's context as served: `serve --max-model-len` caps it, as the worker does on load."""
    cap = settings.INFERENCE.engine.max_model_len
    return min(own, cap) if cap and own else own


def tokenizer_info(model: CacheEntry) -> dict:
    """vLLM's /tokenizer_info: the tokenizer's settings (its added-token table left out: use /detokenize)."""
    config = _json_file(model.snapshot_path / "tokenizer_config.json")
    info = {key: value for key, value in config.items() if key != "added_tokens_decoder"}
    if "chat_template" not in info and (model.snapshot_path / "chat_template.jinja").exists():
        info["chat_template"] = (model.snapshot_path / "chat_template.jinja").read_text()
    return {"model": model.repo_id, "tokenizer_class": info.pop("tokenizer_class", None), **info}


def _visible(principal, name: str | None) -> CacheEntry:
    models = [model for model, _ in listed_models() if principal.may_use(model.repo_id)]
    if name is None:
        if not models:
            raise ModelNotFound("(none)")
        return models[0]
    repo_id = canonical_repo_id(name)
    found = next((model for model in models if model.repo_id == repo_id), None)
    if found is None:
        raise ModelNotFound(name)
    return found


class VersionView(OpenAIView):
    async def get(self, request):
        return Response({"version": VERSION})


class TokenizerInfoView(OpenAIView):
    """`?model=` names the model (default: the first this key may use)."""

    async def get(self, request):
        name = request.query_params.get("model")
        model = await database_sync_to_async(_visible, thread_sensitive=False)(request.auth, name)
        return Response(tokenizer_info(model))
