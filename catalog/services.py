"""Everything that changes the catalog: scans, admin decisions, and what workers report.

Admin actions, commands and views call these; decisions that a worker must act on
go out as `workers.protocol` control messages over the channel layer.
"""
from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from pathlib import Path

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from huggingface_hub import constants as hf_constants
from huggingface_hub import scan_cache_dir

from workers import protocol

from . import hf_cache, selectors
from .errors import ModelNotFound, NoWorker
from .models import CachedModel, LoadEvent, ModelLoad, Worker

logger = logging.getLogger(__name__)
MIB = 1024 * 1024


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
                modalities=list(entry.modalities),
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


# --- decisions workers act on -------------------------------------------------

def _send(channel: str, message: dict) -> None:
    async_to_sync(get_channel_layer().send)(channel, message)


def _group_send(message: dict) -> None:
    async_to_sync(get_channel_layer().group_send)(settings.INFERENCE["WORKER_GROUP"], message)


def broadcast_settings() -> None:
    """Every worker takes the whole settings map at once (no restart)."""
    selectors.forget_rules()
    _group_send({"type": protocol.MODEL_SETTINGS, "settings": selectors.model_settings_map()})


def save_model_settings(model: CachedModel) -> CachedModel:
    """Save settings an admin edited on the row and tell the workers."""
    model.save()
    broadcast_settings()
    return model


def configure_models(entries: list[dict]) -> list[str]:
    """A server config file's per-model settings onto the catalog (they replace the admin's for those keys).

    Each entry: {"name", "preload"?, "dtype"?, "device"?, "chat_template"? (template text),
    "stop"?, "generation_defaults"?, "idle_timeout"?, "aliases"?}; a model not in the cache is ModelNotFound.
    """
    configured = []
    for entry in entries:
        repo_id = selectors.canonical_repo_id(entry["name"])
        row = CachedModel.objects.filter(repo_id=repo_id, gone=False).first()
        if row is None:
            raise ModelNotFound(entry["name"])
        for key in ("preload", "dtype", "device", "chat_template", "idle_timeout", "aliases"):
            if key in entry:
                setattr(row, key, entry[key])
        if "generation_defaults" in entry or "stop" in entry:
            stop = {"stop": entry["stop"]} if entry.get("stop") else {}
            row.generation_defaults = {**(entry.get("generation_defaults") or {}), **stop}
        row.full_clean()
        row.save()
        configured.append(repo_id)
    broadcast_settings()
    return configured


def set_enabled(models, enabled: bool) -> int:
    count = CachedModel.objects.filter(pk__in=[m.pk for m in models]).update(enabled=enabled)
    broadcast_settings()
    if not enabled:
        for model in models:
            request_unload(model.repo_id, "admin:disable")
    return count


def set_idle_timeout(models, seconds: int | None) -> int:
    count = CachedModel.objects.filter(pk__in=[m.pk for m in models]).update(idle_timeout=seconds)
    broadcast_settings()
    return count


def _load_channel(worker: Worker | None) -> str:
    """A given worker's own channel, else the shared one (whichever worker takes it)."""
    return worker.channel_name if worker is not None and worker.channel_name else settings.INFERENCE["WORKER_CHANNEL"]


def request_load(model_name: str, requested_by: str, worker: Worker | None = None) -> str:
    """Ask one worker to load a model without waiting for it; returns where it went."""
    _send(_load_channel(worker), protocol.control_message(protocol.MODEL_LOAD, model_name, None, requested_by))
    return worker.name if worker is not None else "any worker"


def request_unload(model_name: str, requested_by: str) -> None:
    """Ask every worker to unload a model; a worker refuses while the model is generating."""
    _group_send(protocol.control_message(protocol.MODEL_UNLOAD, model_name, None, requested_by))


async def load_model(model_name: str, requested_by: str, *, ack_timeout: float, event_timeout: float,
                     worker: Worker | None = None) -> AsyncIterator[protocol.ControlAccepted | protocol.ProgressMessage]:
    """The round trip of a load: the worker's acceptance, then its progress until a terminal event.

    Raises NoWorker when nobody accepts within `ack_timeout`; a worker silent for `event_timeout`
    ends the stream with an error event of its own (code worker_timeout).
    """
    layer = get_channel_layer()
    reply = await layer.new_channel("reply.")
    await layer.send(_load_channel(worker), protocol.control_message(protocol.MODEL_LOAD, model_name, reply, requested_by))
    try:
        async with asyncio.timeout(ack_timeout):
            message = await layer.receive(reply)
    except TimeoutError:
        raise NoWorker(f"No worker accepted the load of {model_name} within {ack_timeout:.0f}s.") from None
    while True:
        yield message
        if message.get("type") == protocol.MODEL_PROGRESS and protocol.is_terminal(message["event"]):
            return
        try:
            async with asyncio.timeout(event_timeout):
                message = await layer.receive(reply)
        except TimeoutError:
            yield protocol.progress_message(message.get("worker", ""), {
                "status": "error", "model": model_name, "message": "The worker stopped answering.",
                "code": "worker_timeout"})
            return


async def unload_model(model_name: str, requested_by: str, *, timeout: float,
                       answers: int | None = None) -> AsyncIterator[protocol.ProgressMessage]:
    """The round trip of an unload: every worker's answer, until `answers` came (None: all within `timeout`)."""
    layer = get_channel_layer()
    reply = await layer.new_channel("reply.")
    await layer.group_send(settings.INFERENCE["WORKER_GROUP"],
                           protocol.control_message(protocol.MODEL_UNLOAD, model_name, reply, requested_by))
    deadline = asyncio.get_running_loop().time() + timeout
    received = 0
    while answers is None or received < answers:
        try:
            async with asyncio.timeout_at(deadline):  # never around the yield: the caller's work is not timed
                message = await layer.receive(reply)
        except TimeoutError:
            return
        received += 1
        yield message


def delete_from_cache(model: CachedModel, requested_by: str) -> int:
    """Unload everywhere, delete every cached revision from disk, mark the row gone; returns bytes freed."""
    request_unload(model.repo_id, requested_by)
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


# --- what workers report (called by the worker consumer through database_sync_to_async) ---

def register_worker(name: str, host: str, pid: int, channel_name: str, device: str,
                    memory_total_mb: float | None) -> Worker:
    worker, _ = Worker.objects.update_or_create(name=name, defaults=dict(
        host=host, pid=pid, channel_name=channel_name, device=device, memory_total_mb=memory_total_mb,
        status=Worker.Status.ONLINE, last_heartbeat=timezone.now(), memory_used_mb=0.0))
    ModelLoad.objects.filter(worker=worker).exclude(status=ModelLoad.Status.UNLOADED).update(
        status=ModelLoad.Status.UNLOADED)
    return worker


def _catalog_row(model_name: str) -> CachedModel:
    row, _ = CachedModel.objects.get_or_create(repo_id=protocol.ModelRef.parse(model_name).repo_id)
    return row


def heartbeat(name: str, loaded: dict[str, dict], device: str = "") -> None:
    """The worker is alive and holds exactly `loaded` ({name@rev: {"memory_bytes", "last_used"}})."""
    worker, _ = Worker.objects.get_or_create(name=name)  # a row lost with a reset database comes back
    worker.last_heartbeat = timezone.now()
    worker.status = Worker.Status.ONLINE
    worker.memory_used_mb = sum(info["memory_bytes"] for info in loaded.values()) / MIB
    if device:
        worker.device = device
    worker.save(update_fields=["last_heartbeat", "status", "memory_used_mb", "device"])
    held = set()
    for model_name, info in loaded.items():
        row = _catalog_row(model_name)
        held.add(row.pk)
        ModelLoad.objects.update_or_create(model=row, worker=worker, defaults=dict(
            status=ModelLoad.Status.LOADED, memory_mb=info["memory_bytes"] / MIB,
            last_used=datetime.fromtimestamp(info["last_used"], tz=dt_timezone.utc)))
    ModelLoad.objects.filter(worker=worker, status=ModelLoad.Status.LOADED).exclude(model_id__in=held).update(
        status=ModelLoad.Status.UNLOADED)


def record_model_event(worker_name: str, event: protocol.ModelChange) -> None:
    """A load or unload on a worker: its ModelLoad status, and a LoadEvent for the finished ones."""
    worker = Worker.objects.filter(name=worker_name).first()
    if worker is None:
        return
    kind = event["type"]
    if kind in (protocol.MODEL_LOADING, protocol.MODEL_LOAD_FAILED):
        # A name that never existed (a typo) leaves no row: only a model that loaded is known to be real.
        row = CachedModel.objects.filter(repo_id=protocol.ModelRef.parse(event["model"]).repo_id).first()
        if row is None:
            if kind == protocol.MODEL_LOAD_FAILED:
                LoadEvent.objects.create(model_name=event["model"], worker=worker, action=LoadEvent.Action.LOAD,
                                         requested_by=event.get("requested_by", ""),
                                         duration_s=event.get("duration_s"), error=event.get("error") or "")
            return
    else:
        row = _catalog_row(event["model"])
    if kind in (protocol.MODEL_LOADING, protocol.MODEL_LOAD_FAILED) and ModelLoad.objects.filter(
            model=row, worker=worker, status=ModelLoad.Status.LOADED).exists():
        # The worker holds this model and serves it: a load of another revision (a typo, say) that is
        # under way or failed changes nothing it serves. The failure goes into the history only.
        if kind == protocol.MODEL_LOAD_FAILED:
            LoadEvent.objects.create(model_name=event["model"], model=row, worker=worker, action=LoadEvent.Action.LOAD,
                                     requested_by=event.get("requested_by", ""), duration_s=event.get("duration_s"),
                                     error=event.get("error") or "")
        return
    now = timezone.now()
    status = {protocol.MODEL_LOADING: ModelLoad.Status.LOADING, protocol.MODEL_LOADED: ModelLoad.Status.LOADED,
              protocol.MODEL_LOAD_FAILED: ModelLoad.Status.ERROR, protocol.MODEL_UNLOADED: ModelLoad.Status.UNLOADED}[kind]
    defaults: dict = {"status": status, "error": event.get("error") or ""}
    if kind == protocol.MODEL_LOADED:
        defaults.update(loaded_at=now, last_used=now, memory_mb=event.get("memory_bytes", 0) / MIB)
    ModelLoad.objects.update_or_create(model=row, worker=worker, defaults=defaults)
    if kind != protocol.MODEL_LOADING:
        action = LoadEvent.Action.UNLOAD if kind == protocol.MODEL_UNLOADED else LoadEvent.Action.LOAD
        LoadEvent.objects.create(model_name=event["model"], model=row, worker=worker, action=action,
                                 requested_by=event.get("requested_by", ""), duration_s=event.get("duration_s"),
                                 error=event.get("error") or "")


def mark_lost_workers(lost_after: float | None = None) -> list[str]:
    """Workers silent for too long are lost; what they held counts as not loaded."""
    lost_after = settings.INFERENCE["WORKER_LOST_AFTER"] if lost_after is None else lost_after
    cutoff = timezone.now() - timedelta(seconds=lost_after)
    lost = list(Worker.objects.filter(status=Worker.Status.ONLINE, last_heartbeat__lt=cutoff))
    for worker in lost:
        worker.status = Worker.Status.LOST
        worker.memory_used_mb = 0.0
        worker.save(update_fields=["status", "memory_used_mb"])
        ModelLoad.objects.filter(worker=worker).exclude(status=ModelLoad.Status.UNLOADED).update(
            status=ModelLoad.Status.UNLOADED)
        logger.warning("worker %s lost: no heartbeat since %s", worker.name, worker.last_heartbeat)
    return [w.name for w in lost]


def stop_worker(name: str) -> None:
    Worker.objects.filter(name=name).update(status=Worker.Status.STOPPED, memory_used_mb=0.0)
    ModelLoad.objects.filter(worker__name=name).exclude(status=ModelLoad.Status.UNLOADED).update(
        status=ModelLoad.Status.UNLOADED)
