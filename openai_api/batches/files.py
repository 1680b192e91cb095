"""Stored files: rows in the database, bytes under INFERENCE_BATCH_FILES_DIR, always read through a team.

Another team's file does not exist for a caller (404), as OpenAI answers.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from django.conf import settings
from django.db.models import Q, QuerySet

from ..errors import APIError
from .models import StoredFile, new_id

PURPOSES = ("batch",)  # what may be uploaded; `batch_output` is what the runner writes
CHUNK = 1 << 16
ID = re.compile(r"[A-Za-z0-9_-]{1,40}")  # what new_id makes; anything else (a NUL, 1,000 characters) is not found


def files_dir() -> Path:
    path = settings.INFERENCE.batches.files_dir
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def path_of(file: StoredFile) -> Path:
    return files_dir() / file.id


def file_not_found(file_id: str) -> APIError:
    return APIError(404, f"No such File object: {file_id}", param="file_id", code="file_not_found")


def get_file(team_id: int, file_id: str) -> StoredFile:
    file = StoredFile.objects.filter(team_id=team_id, pk=file_id).first() if ID.fullmatch(file_id) else None
    if file is None:
        raise file_not_found(file_id)
    return file


def save_upload(team_id: int, purpose: str, upload) -> StoredFile:
    """An uploaded file written to disk in chunks, then its row; over the size bound: 413, nothing kept."""
    if purpose not in PURPOSES:
        raise APIError(400, f"Invalid purpose {purpose!r}: this server accepts files for 'batch' only.",
                       param="purpose", code="invalid_value")
    limit = settings.INFERENCE.batches.file_max_bytes
    file_id = new_id("file-")
    path = files_dir() / file_id
    size = 0
    try:
        with open(path, "xb") as out:
            for chunk in upload.chunks(CHUNK):
                size += len(chunk)
                if size > limit:
                    raise APIError(413, f"File too large: the limit is {limit} bytes.", param="file",
                                   code="file_too_large")
                out.write(chunk)
        name = os.path.basename(getattr(upload, "name", "") or "upload.jsonl")[:255]
        return StoredFile.objects.create(id=file_id, team_id=team_id, purpose=purpose, filename=name, bytes=size)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def write_file(team_id: int, filename: str, lines: Iterable[bytes]) -> StoredFile:
    """A file the runner produces (an output or error file), purpose `batch_output`."""
    file_id = new_id("file-")
    path = files_dir() / file_id
    size = 0
    with open(path, "wb") as out:
        for line in lines:
            out.write(line)
            size += len(line)
        out.flush()
        os.fsync(out.fileno())
    return StoredFile.objects.create(id=file_id, team_id=team_id, purpose=StoredFile.BATCH_OUTPUT,
                                     filename=filename, bytes=size)


def delete_file(team_id: int, file_id: str) -> None:
    file = get_file(team_id, file_id)
    path = path_of(file)
    file.delete()
    path.unlink(missing_ok=True)


def list_files(team_id: int, purpose: str | None, limit: int, after: str | None, order: str) -> tuple[list, bool]:
    files = StoredFile.objects.filter(team_id=team_id)
    if purpose:
        files = files.filter(purpose=purpose)
    return paginate(files, limit, after, newest_first=order != "asc")


def paginate(rows: QuerySet, limit: int, after: str | None, newest_first: bool = True) -> tuple[list, bool]:
    """A page of `rows` by (created_at, id), after the row `after` (an id; unknown: from the start),
    and whether more follow: OpenAI's cursor lists (`after`, `limit`, `has_more`)."""
    rows = rows.order_by(*(("-created_at", "-id") if newest_first else ("created_at", "id")))
    anchor = rows.filter(pk=after).values("created_at", "id").first() if after and ID.fullmatch(after) else None
    if anchor is not None:
        at, pk = anchor["created_at"], anchor["id"]
        rows = rows.filter(Q(created_at__lt=at) | Q(created_at=at, id__lt=pk)) if newest_first else \
            rows.filter(Q(created_at__gt=at) | Q(created_at=at, id__gt=pk))
    page = list(rows[:limit + 1])
    return page[:limit], len(page) > limit


def list_body(objects: list[dict], has_more: bool) -> dict:
    return {"object": "list", "data": objects, "first_id": objects[0]["id"] if objects else None,
            "last_id": objects[-1]["id"] if objects else None, "has_more": has_more}


def file_object(file: StoredFile) -> dict:
    """OpenAI's `file` object."""
    return {"id": file.id, "object": "file", "bytes": file.bytes, "created_at": int(file.created_at.timestamp()),
            "expires_at": None, "filename": file.filename, "purpose": file.purpose, "status": "processed",
            "status_details": None}
