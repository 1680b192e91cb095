"""`POST /load_model` (SSE progress, as transformers serve) and `POST /unload_model`.

The view resolves the name and relays `catalog.services.load_model`/`unload_model`, the one
model-control round trip (the commands and the admin use it too); the worker owns every decision.
"""
from __future__ import annotations

from collections.abc import AsyncIterator

from channels.db import database_sync_to_async
from django.conf import settings
from django.http import StreamingHttpResponse
from rest_framework.response import Response

from catalog import services
from catalog.errors import ModelNotFound, NoWorker
from catalog.selectors import live_workers
from workers import protocol

from .base import OpenAIView, resolve_model, sse_frame
from .errors import APIError
from .serializers.model_loading import ModelNameSerializer


def requested_by(request) -> str:
    return f"api:{request.auth.label}"


async def _resolved(request) -> str:
    """The model's canonical name; 404 as for an unknown model when the caller may not use it."""
    serializer = ModelNameSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    asked = serializer.validated_data["model"]
    name = await resolve_model(asked)
    if not request.auth.may_use(name):
        raise ModelNotFound(asked)
    if settings.INFERENCE["AUTH_ENABLED"] and not request.auth.may_manage_models:
        raise APIError(403, "Loading and unloading models is for administrators: this key or user lacks the "
                            "manage_models permission.", None, "permission_denied")
    return protocol.ModelRef.parse(name).key


def _no_worker() -> APIError:
    return APIError(503, "No inference worker is available to load the model; try again later.",
                    code="no_worker", headers={"Retry-After": "5"})


class LoadModelView(OpenAIView):
    async def post(self, request):
        name = await _resolved(request)
        config = settings.INFERENCE
        messages = services.load_model(name, requested_by(request), ack_timeout=config["WORKER_ACK_TIMEOUT"],
                                       event_timeout=config["WORKER_EVENT_TIMEOUT"])
        try:
            accepted = await anext(messages)
        except NoWorker:
            raise _no_worker() from None
        if accepted.get("type") != protocol.MODEL_ACCEPTED:
            raise APIError(503, "The worker sent an unexpected message.", code="worker_protocol")
        response = StreamingHttpResponse(self._events(messages), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response

    async def _events(self, messages: AsyncIterator[protocol.ProgressMessage]) -> AsyncIterator[bytes]:
        async for message in messages:
            yield sse_frame(message.get("event") or {})


class UnloadModelView(OpenAIView):
    async def post(self, request):
        """Every worker holding the model unloads it; 409 if one is generating with it."""
        name = await _resolved(request)
        expected = max(1, len(await database_sync_to_async(live_workers, thread_sensitive=False)()))
        replies = [reply async for reply in services.unload_model(
            name, requested_by(request), timeout=settings.INFERENCE["WORKER_ACK_TIMEOUT"], answers=expected)]
        if not replies:
            raise _no_worker()
        events = [(r.get("worker"), r.get("event") or {}) for r in replies]
        busy = [e for _, e in events if e.get("status") == "error"]
        if busy:
            raise APIError(409, busy[0].get("message", "The model could not be unloaded."), "model",
                           busy[0].get("code") or "model_busy")
        unloaded_on = [worker for worker, e in events if e.get("status") == "unloaded"]
        return Response({"status": "unloaded" if unloaded_on else "not_loaded", "model": name,
                         "unloaded_on": unloaded_on})
