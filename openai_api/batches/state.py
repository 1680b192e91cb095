"""The runner's reads and writes: which process holds a batch (runner + heartbeat_at, taken over when
silent), its pending lines, each line's result written once, and the output and error files at the end.

Every write that could race with another process is a conditional UPDATE (compare and set), so a line's
result is recorded, and counted, exactly once.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from protocol import failpoints
from teams.ledger import UsageEntry
from teams.models import APIKey, Team, UsageRecord
from teams.principal import Principal

from .files import delete_file, write_file
from .models import Batch, BatchLine

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchState:
    status: str
    runner: str
    expires_at: datetime
    endpoint: str
    team_id: int
    key_id: int | None
    user_id: int | None


def claim_batches(runner: str, lost_after: float) -> list[str]:
    """Beat for the batches this runner holds, take over those whose runner fell silent; their ids."""
    now = timezone.now()
    Batch.objects.filter(status__in=Batch.ACTIVE, runner=runner).update(heartbeat_at=now)
    stale = now - timedelta(seconds=lost_after)
    orphans = (Batch.objects.filter(status__in=Batch.ACTIVE).exclude(runner=runner)
               .filter(Q(heartbeat_at__isnull=True) | Q(heartbeat_at__lt=stale) | Q(runner=""))
               .values_list("pk", "runner", "heartbeat_at")[:100])
    for pk, old_runner, old_beat in orphans:
        if Batch.objects.filter(pk=pk, runner=old_runner, heartbeat_at=old_beat).update(runner=runner, heartbeat_at=now):
            logger.warning("batch %s: its runner %s fell silent; taken over by %s", pk, old_runner or "-", runner)
    return list(Batch.objects.filter(status__in=Batch.ACTIVE, runner=runner).values_list("pk", flat=True))


def take_new(batch_id: str, runner: str) -> None:
    """A batch just created here is this process's at once (no wait for the next tick's takeover)."""
    Batch.objects.filter(pk=batch_id, runner="").update(runner=runner, heartbeat_at=timezone.now())


def state(batch_id: str) -> BatchState:
    row = Batch.objects.values("status", "runner", "expires_at", "endpoint", "team_id", "key_id", "user_id") \
        .get(pk=batch_id)
    return BatchState(**row)


def pending_lines(batch_id: str, skip: set[int], limit: int) -> list[tuple[int, int, str, dict]]:
    """(pk, index, custom_id, body) of lines not yet done and not running here, in order."""
    rows = (BatchLine.objects.filter(batch_id=batch_id, done=False).exclude(pk__in=skip).order_by("index")
            .values_list("pk", "index", "custom_id", "body")[:limit])
    return list(rows)


@dataclass(frozen=True)
class LineResult:
    pk: int
    result: dict  # the output (or error) file's line
    is_error: bool
    rows: list[UsageEntry] = field(default_factory=list)  # the ledger rows of the run that gave it


def record_lines(batch_id: str, results: list[LineResult]) -> int:
    """Lines' results, and their ledger rows, in one transaction (one commit for a group of lines that
    finished together), each line written once and counted in the batch; how many were written.

    A row goes in even when its line was already written (by a runner that took the batch over): that
    work was done too. A process killed before the commit leaves neither line nor row."""
    failpoints.hit("batch.record")
    counts = {"completed": 0, "failed": 0}
    with transaction.atomic():
        for line in results:
            if BatchLine.objects.filter(pk=line.pk, done=False).update(
                    done=True, result=line.result, is_error=line.is_error):
                counts["failed" if line.is_error else "completed"] += 1
        if any(counts.values()):
            Batch.objects.filter(pk=batch_id).update(**{name: F(name) + n for name, n in counts.items() if n})
        UsageRecord.objects.bulk_create([row.as_model() for line in results for row in line.rows])
    return sum(counts.values())


def mark(batch_id: str, runner: str, status: str, **times: datetime) -> bool:
    """Move the batch this runner holds from an active status to `status`."""
    return bool(Batch.objects.filter(pk=batch_id, runner=runner, status__in=Batch.ACTIVE)
                .update(status=status, **times))


def expire_pending(batch_id: str) -> None:
    """Lines never run before the batch expired go to the error file (OpenAI's `batch_expired`)."""
    error = {"code": "batch_expired",
             "message": "This request could not be executed before the completion window expired."}
    record_lines(batch_id, [LineResult(pk, {"id": f"batch_req_{pk}", "custom_id": custom_id, "response": None,
                                            "error": error}, True)
                            for pk, _, custom_id, _ in pending_lines(batch_id, set(), 10 ** 9)])


def _jsonl(batch_id: str, is_error: bool):
    lines = BatchLine.objects.filter(batch_id=batch_id, done=True, is_error=is_error).order_by("index")
    for result in lines.values_list("result", flat=True).iterator(chunk_size=1000):
        yield (json.dumps(result, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def finalize(batch_id: str, runner: str, status: str) -> None:
    """Write the output and error files from the done lines, then the batch's final status.

    A process that dies here leaves the batch `finalizing`; the next runner writes the files again.
    """
    batch = Batch.objects.get(pk=batch_id)
    output = error = None
    if BatchLine.objects.filter(batch_id=batch_id, done=True, is_error=False).exists():
        output = write_file(batch.team_id, f"{batch_id}_output.jsonl", _jsonl(batch_id, False))
    if BatchLine.objects.filter(batch_id=batch_id, done=True, is_error=True).exists():
        error = write_file(batch.team_id, f"{batch_id}_error.jsonl", _jsonl(batch_id, True))
    now = timezone.now()
    moment = {Batch.COMPLETED: "completed_at", Batch.CANCELLED: "cancelled_at", Batch.EXPIRED: "expired_at"}[status]
    done = (Batch.objects.filter(pk=batch_id, runner=runner, status__in=Batch.ACTIVE)
            .update(status=status, output_file=output, error_file=error, **{moment: now}))
    if not done:  # another runner finished it meanwhile: these copies are nobody's
        for file in (output, error):
            if file is not None:
                delete_file(file.team_id, file.pk)


def principal_of(batch: BatchState) -> Principal:
    """Whom the batch's lines count against: its team, and the key and user that created it."""
    team = Team.objects.get(pk=batch.team_id)
    key = APIKey.objects.filter(pk=batch.key_id).first() if batch.key_id else None
    user = get_user_model().objects.filter(pk=batch.user_id).first() if batch.user_id else None
    return Principal.of(team, user, key)
