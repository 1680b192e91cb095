"""`/v1/responses` and its stored responses: create, retrieve, delete, list input items, cancel.

Thin views: the serializer validates, `response_runs` continues, stores and runs in the
background, `response_store` reads and writes the rows (per team: another team's id is a 404).
"""
from __future__ import annotations

from channels.db import database_sync_to_async
from rest_framework.response import Response

from . import response_runs, response_store
from .base import GenerationView, OpenAIView, resolve_model, sse_response
from .errors import APIError
from .generation import GenerationStream, new_request_id
from .responses import builder_for, collect_response, response_events
from .serializers.responses import ResponsesRequestSerializer


def db(function):
    return database_sync_to_async(function, thread_sensitive=False)


class ResponsesView(GenerationView):
    serializer_class = ResponsesRequestSerializer
    model_task = "generate"

    def new_request_id(self) -> str:
        return new_request_id("resp").replace("-", "_")

    async def post(self, request):
        serializer = self.validated(request.data)
        await response_runs.continue_conversation(serializer, request.auth)
        if serializer.validated_data["background"]:
            model = str(await resolve_model(serializer.validated_data["model"]))
            return Response(await response_runs.start_background(serializer, request, self.new_request_id(), model))
        try:
            return await self.generate(request, serializer)
        except APIError as exc:  # the worker names chat message paths: say which Responses field it meant
            raise serializer.in_responses_terms(exc) from None

    async def respond(self, serializer, request_id: str, model: str, stream: GenerationStream):
        builder = builder_for(serializer, request_id, model)
        store = response_runs.storer(serializer, self.request.auth)
        if serializer.validated_data["stream"]:
            return sse_response(response_events(builder, stream, store), stream)
        response = await collect_response(builder, stream)
        if store is not None:
            await store(response)
        return Response(response)

    async def whole_body(self, serializer, request_id: str, model: str, stream: GenerationStream) -> dict:
        """A batch line's answer: the non-streamed response (batch lines are not stored)."""
        return await collect_response(builder_for(serializer, request_id, model), stream)


class StoredResponseView(OpenAIView):
    """GET (polling a background run too) and DELETE /v1/responses/{id}."""

    async def get(self, request, response_id: str):
        row = await db(response_store.find)(request.auth, response_id)
        await response_runs.resume_if_orphaned(row)
        return Response(row.response)

    async def delete(self, request, response_id: str):
        await db(response_store.delete)(request.auth, response_id)
        response_runs.cancel_local(response_id)
        return Response({"id": response_id, "object": "response.deleted", "deleted": True})


class CancelResponseView(OpenAIView):
    async def post(self, request, response_id: str):
        response = await db(response_store.cancel)(request.auth, response_id)
        response_runs.cancel_local(response_id)
        return Response(response)


class InputItemsView(OpenAIView):
    """GET /v1/responses/{id}/input_items: this turn's input items, OpenAI's list shape (newest first by default)."""

    async def get(self, request, response_id: str):
        row = await db(response_store.find)(request.auth, response_id)
        items = list(row.input_items)
        if request.query_params.get("order", "desc") != "asc":
            items.reverse()
        after = request.query_params.get("after")
        if after:
            ids = [item["id"] for item in items]
            items = items[ids.index(after) + 1:] if after in ids else []
        try:
            limit = min(max(int(request.query_params.get("limit", 20)), 1), 100)
        except ValueError:
            limit = 20
        page = items[:limit]
        return Response({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                         "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit})
