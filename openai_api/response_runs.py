"""Stateful Responses on the request path: continuing a stored conversation, storing an answer, background runs.

A background response is stored `queued` and answered at once; an asyncio task of this web
process runs it (the same job a foreground request sends, metered the same way), beats a
heartbeat into its row every second and stops when the row says cancelled or is gone. Its
request body is stored, so when the process dies, the next poll (GET, or cancel) of the
row in any web process finds the heartbeat stale and runs it again from the start there.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable

from channels.db import database_sync_to_async

from teams.metering import LimitExceeded, RequestMeter
from teams.principal import Principal

from . import response_store
from .base import resolve_model, serializer_context
from .errors import APIError
from .generation import open_generation
from .models import StoredResponse
from .responses import ResponseBuilder, builder_for, collect_response
from .serializers.responses import ResponsesRequestSerializer

logger = logging.getLogger(__name__)
RUNNING: dict[str, asyncio.Task] = {}  # background runs of this process, by response id


def db(function):
    return database_sync_to_async(function, thread_sensitive=False)


async def continue_conversation(serializer: ResponsesRequestSerializer, principal: Principal) -> None:
    """Put a previous_response_id's stored turns before the input (another team's id is a 404)."""
    data = serializer.validated_data
    previous = data.get("previous_response_id")
    history = await db(response_store.conversation_before)(principal, previous) if previous else []
    if data["store"] or previous:
        response_store.check_size(history, data["input_items"])
    serializer.continue_from(history)


def storer(serializer: ResponsesRequestSerializer, principal: Principal) -> Callable[[dict], Awaitable[None]] | None:
    """What stores a finished foreground response (None when store is false)."""
    data = serializer.validated_data
    if not data["store"]:
        return None
    body = serializer.initial_data
    items = response_store.with_ids(data["input_items"])

    async def store(response: dict) -> None:
        try:
            await db(response_store.save)(principal, response, body, data["prior_items"], items)
        except Exception:  # the client still gets its answer; say what was not kept
            logger.exception("could not store response %s", response["id"])

    return store


async def start_background(serializer: ResponsesRequestSerializer, request, response_id: str, model: str) -> dict:
    """Store the response as queued and start its run; the queued response is the HTTP answer."""
    principal = request.auth
    RequestMeter(principal, request.path, response_id).check_model(model, serializer.validated_data["model"])
    response = ResponseBuilder(response_id, model, serializer.validated_data).queued()
    items = response_store.with_ids(serializer.validated_data["input_items"])
    await db(response_store.save)(principal, response, serializer.initial_data,
                                  serializer.validated_data["prior_items"], items, background=True)
    spawn(response_id, principal, serializer.initial_data, serializer.validated_data["prior_items"])
    return response


def spawn(response_id: str, principal: Principal, body: dict, history: list[dict]) -> None:
    task = asyncio.create_task(run(response_id, principal, body, history))
    RUNNING[response_id] = task
    task.add_done_callback(lambda _: RUNNING.pop(response_id, None))


async def resume_if_orphaned(row: StoredResponse) -> None:
    """A poll of a background run whose process died: run it here (once: the claim is atomic)."""
    if row.pk in RUNNING or not await db(response_store.take_over_if_stale)(row):
        return
    logger.warning("background response %s lost its web process; running it again here", row.pk)
    principal = await db(response_store.owner)(row)
    spawn(row.pk, principal, row.request, row.history)


async def run(response_id: str, principal: Principal, body: dict, history: list[dict]) -> None:
    """One background run, start to stored end; cancelled (by the cancel endpoint or a heartbeat) it stores nothing."""
    beating = asyncio.create_task(_heartbeat(response_id, asyncio.current_task()))
    try:
        response = await _generate(response_id, principal, body, history)
    except asyncio.CancelledError:
        logger.info("background response %s cancelled", response_id)
        return
    finally:
        beating.cancel()
    await db(response_store.finish)(response_id, response)


async def _generate(response_id: str, principal: Principal, body: dict, history: list[dict]) -> dict:
    serializer = ResponsesRequestSerializer(data=body, context=serializer_context())
    serializer.is_valid(raise_exception=True)
    serializer.continue_from(history)
    data = serializer.validated_data
    try:
        resolved = await resolve_model(data["model"])
        model = str(resolved)
    except Exception as exc:  # the model went away since the request was taken
        return ResponseBuilder(response_id, data["model"], data).failed("model_not_found", str(exc))
    builder = ResponseBuilder(response_id, model, data)
    await db(response_store.finish)(response_id, {**builder.queued(), "status": "in_progress"})
    meter = RequestMeter(principal, "/v1/responses", response_id)
    meter.check_model(model, data["model"])
    meter.tags = serializer.usage_tags()
    job_id = f"{response_id}.{uuid.uuid4().hex[:8]}"  # a run taken over after a restart is a new job
    try:
        stream = await open_generation(job_id, resolved, serializer.job_prompts(), serializer.job_params(), meter)
        return await collect_response(builder_for(serializer, response_id, model), stream)
    except APIError as exc:
        return builder.failed(exc.code or "server_error", serializer.in_responses_terms(exc).message)
    except LimitExceeded as exc:
        return builder.failed(exc.code, str(exc))


async def _heartbeat(response_id: str, run_task: asyncio.Task) -> None:
    """Beat while the run goes on; a row cancelled or deleted (in any process) stops the run."""
    while True:
        await asyncio.sleep(response_store.HEARTBEAT_SECONDS)
        with contextlib.suppress(Exception):
            if not await db(response_store.heartbeat)(response_id):
                run_task.cancel()
                return


def cancel_local(response_id: str) -> None:
    """Stop this process's run at once (another process's stops at its next heartbeat)."""
    task = RUNNING.get(response_id)
    if task is not None:
        task.cancel()
