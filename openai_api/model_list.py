"""`GET /v1/models` and `GET /v1/models/{id}`: the causal LMs the server can serve."""
from __future__ import annotations

from asgiref.sync import sync_to_async
from rest_framework.response import Response

from catalog.selectors import CachedModel, cached_causal_lms, find_cached_model

from .base import OpenAIView
from .errors import APIError


def model_object(model: CachedModel) -> dict:
    return {
        "id": model.repo_id,
        "object": "model",
        "created": int(model.last_modified),
        "owned_by": model.repo_id.split("/", 1)[0] if "/" in model.repo_id else "local",
    }


class ModelListView(OpenAIView):
    async def get(self, request):
        models = await sync_to_async(cached_causal_lms)()
        return Response({"object": "list", "data": [model_object(m) for m in models]})


class ModelDetailView(OpenAIView):
    async def get(self, request, model_id: str):
        model = await sync_to_async(find_cached_model)(model_id)
        if model is None:
            raise APIError(404, f"The model `{model_id}` does not exist.", param="model", code="model_not_found")
        return Response(model_object(model))
