"""Stored Responses, read and written per team (the model is `openai_api.models.StoredResponse`).

Plain synchronous functions (views call them through `database_sync_to_async`). A response id
another team holds, or one past its retention, does not exist: 404. Background rows carry the
web process running them and its heartbeat, so a poll after that process died takes the run over.
"""
from __future__ import annotations

import datetime as dt
import json
import uuid

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from teams.principal import Principal
from teams.selectors import principal_for_key

from .errors import APIError
from .models import StoredResponse

RUNNER = uuid.uuid4().hex  # this web process, as background rows name their runner
HEARTBEAT_SECONDS = 1.0
STALE_SECONDS = 10.0  # a background row unheard of this long lost its process: a poll takes it over
ITEM_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def not_found(response_id: str) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.", "response_id", "not_found",
                    error_type="invalid_request_error")


def with_ids(items: list[dict]) -> list[dict]:
    """Input items as stored and listed: each with an id (OpenAI's prefixes) and a type."""
    named = []
    for item in items:
        kind = item.get("type", "message")
        named.append({"id": item.get("id") or f"{ITEM_PREFIXES.get(kind, 'item')}_{uuid.uuid4().hex}",
                      "type": kind, **{k: v for k, v in item.items() if k not in ("id", "type")}})
    return named


def _rows(principal: Principal):
    return StoredResponse.objects.filter(team=principal.team, expires_at__gt=timezone.now())


def find(principal: Principal, response_id: str) -> StoredResponse:
    row = _rows(principal).filter(pk=response_id).first()
    if row is None:
        raise not_found(response_id)
    return row


def conversation_before(principal: Principal, response_id: str) -> list[dict]:
    """Every item up to and including a stored response's output: the turns a continuation starts from."""
    row = find(principal, response_id)
    if row.status in StoredResponse.UNFINISHED:
        raise APIError(400, f"Response '{response_id}' is still {row.status}: wait until it ends.",
                       "previous_response_id", "response_not_finished")
    return [*row.history, *row.input_items, *row.response.get("output", [])]


def check_size(history: list[dict], items: list[dict]) -> None:
    """A conversation over INFERENCE_RESPONSES_MAX_BYTES is not stored (nor continued)."""
    limit = settings.INFERENCE.api.responses_max_bytes
    size = len(json.dumps([history, items], ensure_ascii=False, separators=(",", ":")).encode())
    if size > limit:
        raise APIError(400, f"The stored conversation would be {size} bytes, over this server's limit of {limit}: "
                       "start a new one (or send store: false).", "input", "conversation_too_large")


def save(principal: Principal, response: dict, request_body: dict, history: list[dict], input_items: list[dict],
         background: bool = False) -> None:
    """Store a response (a background one while still queued) with its turn's input and what came before."""
    now = timezone.now()
    days = settings.INFERENCE.api.responses_retention_days
    StoredResponse.objects.filter(expires_at__lte=now).delete()  # retention: expired rows go as new ones come
    StoredResponse.objects.create(
        id=response["id"], team=principal.team, key=principal.key, user_id=getattr(principal.user, "pk", None),
        expires_at=now + dt.timedelta(days=days), status=response["status"], background=background,
        request=request_body, history=history, input_items=input_items, response=response,
        runner=RUNNER if background else "", heartbeat_at=now if background else None)


def finish(response_id: str, response: dict) -> bool:
    """A run's final (or in-progress) response; False when the row was cancelled or deleted meanwhile."""
    return StoredResponse.objects.filter(pk=response_id, cancel_requested=False).update(
        status=response["status"], response=response, heartbeat_at=timezone.now()) == 1


def heartbeat(response_id: str) -> bool:
    """The runner is alive; True while the run should go on (not cancelled, not deleted)."""
    return StoredResponse.objects.filter(pk=response_id, cancel_requested=False, runner=RUNNER).update(
        heartbeat_at=timezone.now()) == 1


def take_over_if_stale(row: StoredResponse) -> bool:
    """Claim an unfinished background run whose process went silent (it died, or restarted)."""
    if not row.background or row.status not in StoredResponse.UNFINISHED or row.cancel_requested:
        return False
    stale = timezone.now() - dt.timedelta(seconds=STALE_SECONDS)
    if row.heartbeat_at is not None and row.heartbeat_at > stale:
        return False
    return StoredResponse.objects.filter(pk=row.pk, heartbeat_at=row.heartbeat_at, runner=row.runner).update(
        runner=RUNNER, heartbeat_at=timezone.now()) == 1


def owner(row: StoredResponse) -> Principal:
    """Who a background run is counted against, rebuilt from the row (after a restart there is no request)."""
    if row.key is not None:
        return principal_for_key(row.key)
    return Principal.of(row.team)


def delete(principal: Principal, response_id: str) -> None:
    row = find(principal, response_id)
    with transaction.atomic():
        StoredResponse.objects.filter(pk=row.pk).update(cancel_requested=True)
        row.delete()


def cancel(principal: Principal, response_id: str) -> dict:
    """Cancel a background response (idempotent once it has ended); the runner stops at its next heartbeat."""
    row = find(principal, response_id)
    if not row.background:
        raise APIError(400, "Only background responses can be cancelled.", "response_id", "not_background")
    if row.status in StoredResponse.UNFINISHED:
        row.response = {**row.response, "status": StoredResponse.CANCELLED}
        StoredResponse.objects.filter(pk=row.pk).update(cancel_requested=True, status=StoredResponse.CANCELLED,
                                                        response=row.response)
    return row.response
