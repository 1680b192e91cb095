"""`GET /v1/models` and `GET /v1/models/{id}`: the enabled models the server can serve.

OpenAI's model object plus where each model stands: `status` (cached, loading, loaded, degraded: loaded and
failing most of its recent requests on some worker, error), `health` (a degraded model's `degraded_on` workers,
`failed` of its last `of` requests there and the `last_error`; null otherwise), `loaded_on` (worker names), `size_bytes` on disk, `memory_bytes` a loaded copy holds (quantized weights
as packed; null while loaded nowhere) and the input `modalities` it takes
(text, image, audio, video), `parent` (a LoRA adapter's base), the `tasks` it serves (generate, transcribe, embed: `embed` ones answer
`/v1/embeddings`), the `parsers` its chat answers get ({tool_parser, reasoning_parser, source}), and vLLM's
`root`, `parent` and `max_model_len`.
"""
from __future__ import annotations

from pathlib import Path

from channels.db import database_sync_to_async
from rest_framework.response import Response

from catalog.errors import ModelNotFound
from catalog.hf_cache import CacheEntry
from catalog.selectors import canonical_repo_id, listed_models
from teams.errors import ModelNotAllowed

from .base import OpenAIView
from .server_info import config_max_model_len, served_context_length


def model_object(model: CacheEntry, state: dict, snapshots: dict[str, Path]) -> dict:
    """One model's card; `snapshots` (repo id -> snapshot) gives an adapter its base's context length."""
    context_from = snapshots.get(model.parent, model.snapshot_path) if model.parent else model.snapshot_path
    return {
        "id": model.repo_id,
        "object": "model",
        "created": int(model.last_modified),
        "owned_by": model.repo_id.split("/", 1)[0] if "/" in model.repo_id else "local",
        "status": state["status"],
        "loaded_on": state["loaded_on"],
        "health": state.get("health"),  # a degraded model's recent failures (catalog.selectors.load_states)
        "size_bytes": model.size_on_disk,
        "memory_bytes": None if state.get("memory_mb") is None else int(state["memory_mb"] * 1024 * 1024),  # loaded
        "modalities": list(model.modalities),
        "tasks": list(model.tasks),
        "parsers": state.get("parsers") or None,  # how chat answers are split (protocol.output_formats)
        "root": model.repo_id,  # vLLM's: the model a name serves (aliases and adapters point to theirs)
        "parent": model.parent,  # a LoRA adapter's base model
        # what a loaded copy serves (its KV cache budget may cap it), else what its files say; an adapter's is its base's
        "max_model_len": state.get("max_model_len")
                         or served_context_length(model.context_length or config_max_model_len(context_from)),
        **({"gguf_files": [{"file": name, "quantization": quantization} for name, quantization in model.gguf_files]}
           if model.gguf_files else {}),  # a GGUF model's files (protocol/gguf.py)
    }


class ModelListView(OpenAIView):
    async def get(self, request):
        models = await database_sync_to_async(listed_models, thread_sensitive=False)()
        snapshots = snapshots_of(models)
        return Response({"object": "list", "data": [model_object(m, state, snapshots) for m, state in models
                                                    if request.auth.may_use(m.repo_id)]})


def snapshots_of(models: list[tuple[CacheEntry, dict]]) -> dict[str, Path]:
    return {model.repo_id: model.snapshot_path for model, _ in models}


def _find(model_id: str) -> tuple[CacheEntry, dict, dict[str, Path]] | None:
    repo_id = canonical_repo_id(model_id)
    models = listed_models()
    found = next(((m, s) for m, s in models if m.repo_id == repo_id), None)
    return None if found is None else (*found, snapshots_of(models))


class ModelDetailView(OpenAIView):
    async def get(self, request, model_id: str):
        found = await database_sync_to_async(_find, thread_sensitive=False)(model_id)
        if found is None:
            raise ModelNotFound(model_id)
        if not request.auth.may_use(found[0].repo_id):
            raise ModelNotAllowed(model_id)
        return Response(model_object(*found))
