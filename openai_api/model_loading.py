"""`POST /load_model` (SSE progress, as transformers serve) and `POST /unload_model`.

The view resolves the name and relays `catalog.services.model_control.load_model`/`unload_model`, the one
model-control round trip (the commands and the admin use it too); the worker owns every decision.
"""
from __future__ import annotations

from collections.abc import AsyncIterator

from channels.db import database_sync_to_async
from django.conf import settings
from django.http import StreamingHttpResponse
from rest_framework.exceptions import NotAuthenticated
from rest_framework.response import Response

from catalog.services import model_control
from catalog.errors import NoWorker
from catalog.selectors import canonical_repo_id, live_workers, load_state, serves
from teams.errors import ModelNotAllowed
from teams.selectors import open_to_every_team
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
    if settings.INFERENCE.teams.auth_enabled and not request.auth.may_manage_models:
        raise APIError(403, "Loading and unloading models is for administrators: this key or user lacks the "
                            "manage_models permission.", None, "permission_denied")
    return model


def _no_worker() -> APIError:
    return APIError(503, "No inference worker is available to load the model; try again later.",
                    code="no_worker", headers={"Retry-After": "5"})


def _ready_without_the_right(request) -> dict | None:
    """`ready` for a model some live worker holds now, told to a caller without a key or without manage_models:
    a deliberate exception to the key rule (docs/teams.md). `transformers chat` posts `{"model": name}` here
    before every session without the key it sends to the API (and most keys may not load models), so with the
    model loaded (pinned, preloaded, or in use) it works with auth on. It changes nothing and tells no more than
    that one bit about a name the caller already knows: the body must name the model and nothing else (the
    pinned model is never assumed), and the model must be one this key's team may use, or, without a key, one
    every team may use. Otherwise (None) the caller gets what it would have got without the exception."""
    data = request.data if isinstance(request.data, dict) else {}
    name = data.get("model")
    if not isinstance(name, str) or not 0 < len(name) <= 300 or set(data) != {"model"}:
        return None
    try:
        repo_id = canonical_repo_id(name)
    except ValueError:
        return None
    if not (request.auth.may_use(repo_id) if request.auth is not None else open_to_every_team(repo_id)):
        return None
    state = load_state(repo_id)
    if not serves(state):
        return None
    return {"status": "ready", "model": name, "cached": True}


class LoadModelView(OpenAIView):
    permission_classes: list = []  # a caller without a key (or without manage_models) may learn a model is loaded

    async def post(self, request):
        if request.auth is None or (settings.INFERENCE.teams.auth_enabled and not request.auth.may_manage_models):
            ready = await database_sync_to_async(_ready_without_the_right, thread_sensitive=False)(request)
            if ready is not None:
                return _event_stream(_frames(ready))
            if request.auth is None:  # anything else needs a key (before the name is even looked up)
                raise NotAuthenticated()
        name = await _resolved(request)
        config = settings.INFERENCE.jobs
        messages = model_control.load_model(name, requested_by(request), ack_timeout=config.worker_ack_timeout,
                                       event_timeout=config.worker_event_timeout)
        try:
            accepted = await anext(messages)
        except NoWorker:
            raise _no_worker() from None
        if accepted.get("type") != protocol.MODEL_ACCEPTED:
            raise APIError(503, "The worker sent an unexpected message.", code="worker_protocol")
        return _event_stream(_frames(messages=messages))


async def _frames(*events: dict, messages: AsyncIterator[protocol.ProgressMessage] | None = None) -> AsyncIterator[bytes]:
    for event in events:
        yield sse_frame(event)
    if messages is not None:
        async for message in messages:
            yield sse_frame(message.get("event") or {})


def _event_stream(frames: AsyncIterator[bytes]) -> StreamingHttpResponse:
    response = StreamingHttpResponse(frames, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


class UnloadModelView(OpenAIView):
    async def post(self, request):
        """Every worker holding the model unloads it; 409 if one is generating with it."""
        name = await _resolved(request)
        expected = max(1, len(await database_sync_to_async(live_workers, thread_sensitive=False)()))
        replies = [reply async for reply in model_control.unload_model(
            name, requested_by(request), timeout=settings.INFERENCE.jobs.worker_ack_timeout, answers=expected)]
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
