"""`GET /health` (readiness: the database and some worker answer) and `GET /health/live` (liveness).

Open to all, for load balancers, supervisors and start-up probes. /health asks every worker
over the channel layer and takes the first answer, so it sees what a request would see:
Redis down or every worker dead is a 503, whatever the heartbeats in the database say.
"""
from __future__ import annotations

import asyncio

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.http import JsonResponse

import protocol

from .errors import SERVICE_RETRY_AFTER, error_body


def _wrong_method(request) -> JsonResponse | None:
    """Probes read: any other method is a 405 in OpenAI's shape."""
    if request.method in ("GET", "HEAD"):
        return None
    response = JsonResponse(error_body(405, f"Method {request.method} is not allowed here; use GET.", None,
                                       "method_not_allowed"), status=405)
    response["Allow"] = "GET, HEAD"
    return response


async def live(request) -> JsonResponse:
    """The process serves HTTP; nothing else is checked (restart it only if this fails)."""
    return _wrong_method(request) or JsonResponse({"status": "ok"})


def _query_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


async def _database_problem(timeout: float) -> str | None:
    try:
        async with asyncio.timeout(timeout):
            await database_sync_to_async(_query_database, thread_sensitive=False)()
    except TimeoutError:
        return f"the database did not answer within {timeout:g}s"
    except Exception as exc:
        return f"the database is unreachable: {exc}".strip()
    return None


async def _worker_problem(timeout: float, degraded: dict[str, dict]) -> str | None:
    """Ping the group of workers; any answer from a worker whose engine is alive will do.

    A worker answers from its event loop but reports its engine thread's own liveness
    (workers/engine/core/supervision.py): a dead or stalled engine is named here, never counted as healthy.
    """
    layer = get_channel_layer()
    sick: dict[str, str] = {}
    try:
        async with asyncio.timeout(timeout):
            reply = await layer.new_channel("health.")
            await layer.group_send(settings.INFERENCE.fleet.worker_group, protocol.ping_message(reply))
            while True:
                message = await layer.receive(reply)
                if message.get("type") != protocol.PONG:
                    continue
                degraded.update(message.get("degraded") or {})
                if not message.get("problem"):
                    return None
                sick[message.get("worker") or "?"] = message["problem"]
    except TimeoutError:
        if sick:
            return "no worker can serve: " + "; ".join(f"worker {name}: {why}" for name, why in sorted(sick.items()))
        return f"no worker answered within {timeout:g}s"
    except Exception as exc:
        return f"the channel layer is unreachable: {exc}".strip()


# What this process knows of itself that a ping cannot tell (`serve`: its embedded engine restarting, or
# stopping for good), by source; set with `report_problem`, read by every /health.
LOCAL_PROBLEMS: dict[str, str] = {}


def report_problem(source: str, problem: str | None) -> None:
    """`problem` (None: it is over) for /health to name until it is cleared."""
    if problem is None:
        LOCAL_PROBLEMS.pop(source, None)
    else:
        LOCAL_PROBLEMS[source] = problem


async def health(request) -> JsonResponse:
    if (refused := _wrong_method(request)) is not None:
        return refused
    timeout = settings.INFERENCE.api.health_timeout
    degraded: dict[str, dict] = {}
    checks = await asyncio.gather(_database_problem(timeout), _worker_problem(timeout, degraded))
    problems = [f"{source}: {problem}" for source, problem in LOCAL_PROBLEMS.items()]
    problems += [problem for problem in checks if problem]
    if not problems:  # ready; a model failing most of its requests is named (the others serve on: still 200)
        if degraded:
            return JsonResponse({"status": "degraded", "models": {name: {"status": "degraded", **record}
                                                                  for name, record in degraded.items()}})
        return JsonResponse({"status": "ok"})
    body = {"status": "unavailable", "reasons": problems,
            **error_body(503, "; ".join(problems), None, "unhealthy")}
    response = JsonResponse(body, status=503)
    response["Retry-After"] = str(SERVICE_RETRY_AFTER)
    return response
