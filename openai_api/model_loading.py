"""`POST /load_model` (SSE progress, as transformers serve) and `POST /unload_model`.

The view resolves the name, sends a `model.load` control message to the worker channel
and relays the worker's events verbatim; the worker owns every decision.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.http import StreamingHttpResponse
from rest_framework.response import Response

from catalog.selectors import live_workers, resolve_model_id
from workers import protocol

from .base import OpenAIView, sse_frame
from .errors import APIError
from .generation import receive_within
from .serializers.model_loading import ModelNameSerializer


def requested_by(request) -> str:
    return f"api:{getattr(request.user, 'name', None) or 'anonymous'}"


async def _resolved(request) -> str:
    serializer = ModelNameSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    name = await sync_to_async(resolve_model_id)(serializer.validated_data["model"])
    return protocol.ModelRef.parse(name).key


def _no_worker() -> APIError:
    return APIError(503, "No inference worker is available to load the model; try again later.",
                    code="no_worker", headers={"Retry-After": "5"})


class LoadModelView(OpenAIView):
    async def post(self, request):
        name = await _resolved(request)
        layer = get_channel_layer()
        reply = await layer.new_channel("reply.")
        config = settings.INFERENCE
        await layer.send(config["WORKER_CHANNEL"],
                         protocol.control_message(protocol.MODEL_LOAD, name, reply, requested_by(request)))
        try:
            accepted = await receive_within(layer, reply, config["WORKER_ACK_TIMEOUT"])
        except TimeoutError:
            raise _no_worker() from None
        if accepted.get("type") != protocol.MODEL_ACCEPTED:
            raise APIError(503, "The worker sent an unexpected message.", code="worker_protocol")
        response = StreamingHttpResponse(self._events(layer, reply, name), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response

    async def _events(self, layer, reply: str, name: str) -> AsyncIterator[bytes]:
        timeout = settings.INFERENCE["WORKER_EVENT_TIMEOUT"]
        while True:
            try:
                message = await receive_within(layer, reply, timeout)
            except TimeoutError:
                yield sse_frame({"status": "error", "model": name, "message": "The worker stopped answering.",
                                 "code": "worker_timeout"})
                return
            event = message.get("event") or {}
            yield sse_frame(event)
            if protocol.is_terminal(event):
                return


class UnloadModelView(OpenAIView):
    async def post(self, request):
        """Every worker holding the model unloads it; 409 if one is generating with it."""
        name = await _resolved(request)
        expected = max(1, len(await sync_to_async(live_workers)()))
        layer = get_channel_layer()
        reply = await layer.new_channel("reply.")
        config = settings.INFERENCE
        await layer.group_send(config["WORKER_GROUP"],
                               protocol.control_message(protocol.MODEL_UNLOAD, name, reply, requested_by(request)))
        replies: list[dict] = []
        try:
            async with asyncio.timeout(config["WORKER_ACK_TIMEOUT"]):
                while len(replies) < expected:
                    replies.append(await layer.receive(reply))
        except TimeoutError:
            if not replies:
                raise _no_worker() from None
        events = [(r.get("worker"), r.get("event") or {}) for r in replies]
        busy = [e for _, e in events if e.get("status") == "error"]
        if busy:
            raise APIError(409, busy[0].get("message", "The model could not be unloaded."), "model",
                           busy[0].get("code") or "model_busy")
        unloaded_on = [worker for worker, e in events if e.get("status") == "unloaded"]
        return Response({"status": "unloaded" if unloaded_on else "not_loaded", "model": name,
                         "unloaded_on": unloaded_on})
