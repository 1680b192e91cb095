"""Creating, reading, listing and cancelling batches, and checking a batch's input file (its lines).

A batch is created `validating`; the runner (runner.py) checks its input here, turning each line into
a BatchLine row (`in_progress`) or failing the batch with OpenAI's `errors` list.
"""
from __future__ import annotations

import json
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ..errors import APIError
from .files import ID, file_not_found, get_file, paginate, path_of
from .models import Batch, BatchLine, StoredFile, new_id

ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/embeddings")
WINDOWS = {"24h": timedelta(hours=24)}
MAX_ERRORS = 100  # validation errors reported per batch (OpenAI lists a bounded number too)


def batch_not_found(batch_id: str) -> APIError:
    return APIError(404, f"No such Batch object: {batch_id}", param="batch_id", code="batch_not_found")


def create_batch(principal, input_file_id: str, endpoint: str, completion_window: str,
                 metadata: dict | None) -> Batch:
    if endpoint not in ENDPOINTS:
        raise APIError(400, f"Invalid endpoint {endpoint!r}: one of {', '.join(ENDPOINTS)}.", param="endpoint",
                       code="invalid_value")
    if completion_window not in WINDOWS:
        raise APIError(400, f"Invalid completion_window {completion_window!r}: only '24h' is supported.",
                       param="completion_window", code="invalid_value")
    file = StoredFile.objects.filter(team_id=principal.team.pk, pk=input_file_id).first() \
        if ID.fullmatch(input_file_id) else None
    if file is None:
        raise file_not_found(input_file_id)
    if file.purpose != StoredFile.BATCH:
        raise APIError(400, f"File {input_file_id} has purpose {file.purpose!r}; a batch's input needs 'batch'.",
                       param="input_file_id", code="invalid_value")
    return Batch.objects.create(
        id=new_id("batch_"), team_id=principal.team.pk, key=principal.key,
        user=principal.user if getattr(principal.user, "pk", None) else None, endpoint=endpoint,
        completion_window=completion_window, input_file=file, metadata=metadata,
        expires_at=timezone.now() + WINDOWS[completion_window])


def get_batch(team_id: int, batch_id: str) -> Batch:
    batch = Batch.objects.filter(team_id=team_id, pk=batch_id).first() if ID.fullmatch(batch_id) else None
    if batch is None:
        raise batch_not_found(batch_id)
    return batch


def list_batches(team_id: int, limit: int, after: str | None) -> tuple[list[Batch], bool]:
    return paginate(Batch.objects.filter(team_id=team_id), limit, after)


def cancel_batch(team_id: int, batch_id: str) -> Batch:
    """`cancelling` now; the runner stops its lines and makes it `cancelled` (with what was done)."""
    with transaction.atomic():
        batch = Batch.objects.select_for_update().filter(team_id=team_id, pk=batch_id).first() \
            if ID.fullmatch(batch_id) else None
        if batch is None:
            raise batch_not_found(batch_id)
        if batch.status in (Batch.CANCELLING, Batch.CANCELLED):
            return batch
        if batch.status not in (Batch.VALIDATING, Batch.IN_PROGRESS):
            raise APIError(409, f"Cannot cancel a batch with status {batch.status!r}.", code="batch_not_cancellable")
        batch.status, batch.cancelling_at = Batch.CANCELLING, timezone.now()
        batch.save(update_fields=["status", "cancelling_at"])
    return batch


def line_error(code: str, message: str, line: int | None, param: str | None = None) -> dict:
    return {"code": code, "message": message, "param": param, "line": line}


def check_line(number: int, raw: bytes, endpoint: str, seen: set[str]) -> tuple[dict | None, dict | None]:
    """(the parsed line, None) or (None, the error): OpenAI's checks of a batch input line."""
    try:
        line = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None, line_error("invalid_json_line", "This line is not parseable as valid JSON.", number)
    if not isinstance(line, dict):
        return None, line_error("invalid_request", "A line must be a JSON object.", number)
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > 512:
        return None, line_error("missing_required_parameter", "custom_id must be a string of 1 to 512 characters.",
                                number, "custom_id")
    if custom_id in seen:
        return None, line_error("duplicate_custom_id", f"The custom_id {custom_id!r} appears more than once.",
                                number, "custom_id")
    if line.get("method") != "POST":
        return None, line_error("invalid_method", "method must be 'POST'.", number, "method")
    if line.get("url") != endpoint:
        return None, line_error("invalid_url", f"url must be the batch's endpoint {endpoint!r}.", number, "url")
    if not isinstance(line.get("body"), dict):
        return None, line_error("invalid_request", "body must be a JSON object.", number, "body")
    seen.add(custom_id)
    return line, None


def validate_input(batch_id: str) -> Batch:
    """Read the input file into BatchLine rows (`in_progress`), or fail the batch with its `errors`."""
    batch = Batch.objects.select_related("input_file").get(pk=batch_id)
    if batch.status != Batch.VALIDATING:
        return batch
    errors, lines, seen = [], [], set()
    max_lines = settings.INFERENCE.batches.max_lines
    try:
        with open(path_of(batch.input_file), "rb") as source:
            for number, raw in enumerate(source, start=1):
                if not raw.strip():
                    continue
                line, error = check_line(number, raw, batch.endpoint, seen)
                if error is not None:
                    errors.append(error)
                elif len(errors) == 0:
                    lines.append(BatchLine(batch_id=batch.pk, index=len(lines), custom_id=line["custom_id"],
                                           body=line["body"]))
                if len(lines) > max_lines:
                    errors.append(line_error("too_many_requests", f"A batch may have at most {max_lines} lines.",
                                             None))
                    break
                if len(errors) >= MAX_ERRORS:
                    break
    except (OSError, AttributeError):
        errors.append(line_error("file_not_found", "The input file is gone.", None, "input_file_id"))
    if not lines and not errors:
        errors.append(line_error("empty_file", "The input file has no lines.", None, "input_file_id"))
    with transaction.atomic():
        current = Batch.objects.select_for_update().get(pk=batch_id)
        if current.status != Batch.VALIDATING:  # cancelled meanwhile
            return current
        now = timezone.now()
        if errors:
            current.status, current.failed_at, current.errors = Batch.FAILED, now, errors
            current.save(update_fields=["status", "failed_at", "errors"])
            return current
        BatchLine.objects.bulk_create(lines, batch_size=1000)
        current.status, current.in_progress_at, current.total = Batch.IN_PROGRESS, now, len(lines)
        current.save(update_fields=["status", "in_progress_at", "total"])
        return current


def _seconds(moment) -> int | None:
    return int(moment.timestamp()) if moment else None


def batch_object(batch: Batch) -> dict:
    """OpenAI's `batch` object."""
    return {
        "id": batch.pk, "object": "batch", "endpoint": batch.endpoint,
        "errors": {"object": "list", "data": batch.errors} if batch.errors else None,
        "input_file_id": batch.input_file_id, "completion_window": batch.completion_window, "status": batch.status,
        "output_file_id": batch.output_file_id, "error_file_id": batch.error_file_id,
        **{name: _seconds(getattr(batch, name)) for name in (
            "created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
            "cancelling_at", "cancelled_at")},
        "request_counts": {"total": batch.total, "completed": batch.completed, "failed": batch.failed},
        "metadata": batch.metadata,
    }
