"""`POST /load_model` (SSE progress, as transformers serve) and `POST /unload_model`.

The view resolves the name and relays `catalog.services.model_control.load_model`/`unload_model`, the one
model-control round trip (the commands and the admin use it too); the worker owns every decision.
"""
from __future__ import annotations

from collections.abc import AsyncIterator

from channels.db import database_sync_to_async
from django.http import StreamingHttpResponse
from rest_framework.response import Response

from catalog.services import model_control
from catalog.config import web_config
from catalog.errors import NoWorker
from catalog.selectors import live_workers
from teams.errors import ModelNotAllowed
import protocol

from .base import OpenAIView, resolve_model, sse_frame
from .errors import APIError
from .serializers.model_loading import ModelNameSerializer


def requested_by(request) -> str:
    return f"api:{request.auth.label}"


async def _resolved(request) -> protocol.ModelRef:
    """The model's canonical name; 404 as for an unknown model when the caller may not use it."""
    serializer = ModelNameSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    asked = serializer.validated_data["model"]
    model = await resolve_model(asked)
    if not request.auth.may_use(str(model)):
        raise ModelNotAllowed(asked)
    if web_config().auth_enabled and not request.auth.may_manage_models:
        raise APIError(403, "Loading and unloading models is for administrators: this key or user lacks the "
                            "manage_models permission.", None, "permission_denied")
    return model


def _no_worker() -> APIError:
    return APIError(503, "No inference worker is available to load the model; try again later.",
                    code="no_worker", headers={"Retry-After": "5"})


class LoadModelView(OpenAIView):
    async def post(self, request):
        name = await _resolved(request)
        config = web_config()
        messages = model_control.load_model(name, requested_by(request), ack_timeout=config.worker_ack_timeout,
                                       event_timeout=config.worker_event_timeout)
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
        replies = [reply async for reply in model_control.unload_model(
            name, requested_by(request), timeout=web_config().worker_ack_timeout, answers=expected)]
        if not replies:
            raise _no_worker()
        events = [(r.get("worker"), r.get("event") or {}) for r in replies]
        busy = [e for _, e in events if e.get("status") == "error"]
        if busy:
            raise APIError(409, busy[0].get("message", "The model could not be unloaded."), "model",
                           busy[0].get("code") or "model_busy")
        unloaded_on = [worker for worker, e in events if e.get("status") == "unloaded"]
        return Response({"status": "unloaded" if unloaded_on else "not_loaded", "model": name.key,
                         "unloaded_on": unloaded_on})
