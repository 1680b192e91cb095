"""Spool rows the database refuses for good: salvaged where the refusal is a deleted key or team,
else dead-lettered, so one bad row never holds up the rows spooled after it.

A spool belongs to one database (`database_spool_dir`): a spool left by a server on another
database is never replayed into this one. On replay, a row whose key was deleted while it sat in
the spool is still billed to the key's team; with the team gone too it is kept with the key's
visible prefix in its tags. A row the database still rejects (an integrity or data error, not a
connection error: those are retried) is appended to `dead-letter.jsonl` beside the spool, logged
once at ERROR and counted in `/metrics` as `inference_usage_rows_dead_lettered_total`.
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import DataError, IntegrityError, connections, transaction
from prometheus_client import Counter

logger = logging.getLogger("teams.ledger")

DEAD_LETTER_FILE = "dead-letter.jsonl"
DEAD_LETTERED = Counter("inference_usage_rows_dead_lettered",
                        "Usage rows the database refused for good, set aside in the spool's dead-letter file.")


def database_spool_dir(base: str | Path, alias: str = "default") -> Path:
    """`base/db-<hash>`: the spool of the database this process writes to (engine, name, host, port).
    Spool files an older version left in `base` itself (one spool for every database) are taken into it,
    so rows spooled before an upgrade are still replayed (a row another database's server left there is
    refused by this one and dead-lettered, never lost)."""
    settings = connections[alias].settings_dict
    identity = "|".join(str(settings.get(part) or "") for part in ("ENGINE", "NAME", "HOST", "PORT"))
    directory = Path(base) / f"db-{hashlib.sha256(identity.encode()).hexdigest()[:12]}"
    left = [path for pattern in ("usage-*.jsonl", "journal-*.jsonl") for path in Path(base).glob(pattern)]
    if left:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        for path in left:
            try:
                path.rename(directory / path.name)
            except OSError:  # another process took it first
                continue
        logger.info("took %d spool file(s) of an earlier version into %s", len(left), directory)
    return directory


def salvage(rows: list[dict]) -> list[dict]:
    """Rows whose key, team or user is gone from the database, pointed at what is left of them."""
    from django.contrib.auth import get_user_model

    from .models import APIKey, Team

    def present(model, ids) -> set:
        ids = {i for i in ids if i is not None}
        return set(model.objects.filter(pk__in=ids).values_list("pk", flat=True)) if ids else set()

    keys = present(APIKey, (row.get("key_id") for row in rows))
    teams = present(Team, (row.get("team_id") for row in rows))
    users = present(get_user_model(), (row.get("user_id") for row in rows))
    salvaged = []
    for row in rows:
        row = dict(row)
        if row.get("key_id") is not None and row["key_id"] not in keys:
            row["key_id"] = None
        if row.get("user_id") is not None and row["user_id"] not in users:
            row["user_id"] = None
        if row.get("team_id") is not None and row["team_id"] not in teams:
            row["team_id"] = None
            row["tags"] = {**(row.get("tags") or {}), "deleted_key_prefix": row.get("key_prefix") or ""}
        salvaged.append(row)
    return salvaged


def insert_each(rows: list[dict], directory: Path, source: str, record_of: Callable[[dict], Any]) -> int:
    """Insert `rows` one by one after `salvage` (`record_of`: a row's unsaved model instance); those still
    refused go to the dead-letter file. Returns how many were inserted. A connection error propagates: the
    segment is retried later."""
    inserted, refused = 0, []
    for row in salvage(rows):
        try:
            with transaction.atomic():
                record_of(row).save()
            inserted += 1
        except (IntegrityError, DataError, ValueError, TypeError, KeyError) as exc:
            refused.append((row, exc))
    if refused:
        with open(directory / DEAD_LETTER_FILE, "a", encoding="utf-8") as file:
            for row, exc in refused:
                file.write(json.dumps({"row": row, "error": str(exc), "segment": source}, default=str) + "\n")
        DEAD_LETTERED.inc(len(refused))
        logger.error("%d usage rows from %s refused by the database (first: %s: %s); set aside in %s",
                     len(refused), source, refused[0][0].get("request_id"), refused[0][1],
                     directory / DEAD_LETTER_FILE)
    return inserted
