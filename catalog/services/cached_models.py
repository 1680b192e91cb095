"""The Hugging Face cache into catalog rows (scans), and a model deleted from the cache."""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from datetime import datetime
from datetime import timezone as dt_timezone
from pathlib import Path

from django.db import transaction
from django.utils import timezone
from huggingface_hub import constants as hf_constants
from huggingface_hub import scan_cache_dir

import protocol

from .. import hf_cache
from ..models import CachedModel, LoadEvent
from .model_control import request_unload


@dataclass
class ScanResult:
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{len(self.added)} added, {len(self.updated)} updated, {len(self.gone)} gone"


def scan_cache(cache_dir: str | Path | None = None) -> ScanResult:
    """Bring CachedModel rows in line with the cache; rows of vanished repos are marked gone, never dropped."""
    found = hf_cache.scan_cached_models(cache_dir)
    hf_cache.forget_scan()
    now = timezone.now()
    result = ScanResult()
    with transaction.atomic():
        existing = {m.repo_id: m for m in CachedModel.objects.all()}
        for entry in found:
            row = existing.get(entry.repo_id)
            values = dict(
                revision=entry.revision, revisions=list(entry.revisions), size_on_disk=entry.size_on_disk,
                architectures=list(entry.architectures), is_causal_lm=entry.is_causal_lm,
                modalities=list(entry.modalities), detected_parsers=dict(entry.parsers),
                gguf_files=[list(pair) for pair in entry.gguf_files],
                last_modified=datetime.fromtimestamp(entry.last_modified, tz=dt_timezone.utc),
                last_scanned=now, gone=False,
            )
            if row is None:
                CachedModel.objects.create(repo_id=entry.repo_id, **values)
                result.added.append(entry.repo_id)
            else:
                CachedModel.objects.filter(pk=row.pk).update(**values)
                result.updated.append(entry.repo_id)
        names = {entry.repo_id for entry in found}
        for repo_id, row in existing.items():
            if repo_id not in names and not row.gone:
                CachedModel.objects.filter(pk=row.pk).update(gone=True, last_scanned=now)
                result.gone.append(repo_id)
    return result


def delete_from_cache(model: CachedModel, requested_by: str) -> int:
    """Unload everywhere, delete every cached revision from disk, mark the row gone; returns bytes freed."""
    request_unload(protocol.ModelRef(model.repo_id), requested_by)
    freed = 0
    cache = Path(hf_constants.HF_HUB_CACHE)
    if cache.is_dir():
        info = scan_cache_dir(cache)
        for repo in info.repos:
            if repo.repo_type == "model" and repo.repo_id == model.repo_id:
                strategy = info.delete_revisions(*[rev.commit_hash for rev in repo.revisions])
                freed = strategy.expected_freed_size
                strategy.execute()
                if repo.repo_path.exists():  # refs or blobs the strategy left behind
                    shutil.rmtree(repo.repo_path, ignore_errors=True)
    hf_cache.forget_scan()
    model.gone = True
    model.save(update_fields=["gone"])
    LoadEvent.objects.create(model_name=model.repo_id, model=model, action=LoadEvent.Action.UNLOAD,
                             requested_by=requested_by, error=f"deleted from cache ({freed} bytes)")
    return freed
