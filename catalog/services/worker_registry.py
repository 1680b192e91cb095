"""What workers report: registration, heartbeats, model events; lost and stopped workers.

Called by the worker's adapter (`workers.adapter.catalog_sync`, through database_sync_to_async)
and by the catalog's upkeep (`catalog.periodic`).
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

from django.conf import settings
from django.utils import timezone

import protocol

from ..models import CachedModel, LoadEvent, ModelLoad, Worker

logger = logging.getLogger(__name__)
MIB = 1024 * 1024


# A load's health fields when it has no recent requests counted: after a load, an unload, a worker lost.
HEALTHY = {"degraded": False, "recent_failed": 0, "recent_jobs": 0, "last_error": ""}


def _health_fields(record: dict | None) -> dict:
    """A worker's record of a model's recent requests ({degraded, failed, of, last_error}) as ModelLoad fields."""
    if not record:
        return dict(HEALTHY)
    return {"degraded": bool(record.get("degraded")), "recent_failed": int(record.get("failed") or 0),
            "recent_jobs": int(record.get("of") or 0), "last_error": str(record.get("last_error") or "")}


def register_worker(name: str, host: str, pid: int, channel_name: str, device: str,
                    memory_total_mb: float | None) -> Worker:
    worker, _ = Worker.objects.update_or_create(name=name, defaults=dict(
        host=host, pid=pid, channel_name=channel_name, device=device, memory_total_mb=memory_total_mb,
        status=Worker.Status.ONLINE, last_heartbeat=timezone.now(), memory_used_mb=0.0))
    ModelLoad.objects.filter(worker=worker).exclude(status=ModelLoad.Status.UNLOADED).update(
        status=ModelLoad.Status.UNLOADED, **HEALTHY)
    return worker


def _catalog_row(model_name: str) -> CachedModel:
    row, _ = CachedModel.objects.get_or_create(repo_id=protocol.ModelRef.parse(model_name).repo_id)
    return row


def heartbeat(name: str, loaded: dict[str, dict], device: str = "", free_slots: int | None = None,
              health: dict[str, dict] | None = None) -> None:
    """The worker is alive and holds exactly `loaded` ({name@rev: {"memory_bytes", "last_used", "max_model_len"?}}),
    whose recent requests went as `health` says ({name@rev: {"degraded", "failed", "of", "last_error"}}; none:
    all well)."""
    health = health or {}
    worker, _ = Worker.objects.get_or_create(name=name)  # a row lost with a reset database comes back
    worker.last_heartbeat = timezone.now()
    worker.status = Worker.Status.ONLINE
    worker.memory_used_mb = sum(info["memory_bytes"] for info in loaded.values()) / MIB
    worker.free_slots = free_slots
    if device:
        worker.device = device
    worker.save(update_fields=["last_heartbeat", "status", "memory_used_mb", "device", "free_slots"])
    held = set()
    for model_name, info in loaded.items():
        row = _catalog_row(model_name)
        held.add(row.pk)
        ModelLoad.objects.update_or_create(model=row, worker=worker, defaults=dict(
            status=ModelLoad.Status.LOADED, memory_mb=info["memory_bytes"] / MIB, max_model_len=info.get("max_model_len"),
            last_used=datetime.fromtimestamp(info["last_used"], tz=dt_timezone.utc),
            **_health_fields(health.get(model_name))))
    ModelLoad.objects.filter(worker=worker, status=ModelLoad.Status.LOADED).exclude(model_id__in=held).update(
        status=ModelLoad.Status.UNLOADED, **HEALTHY)


def record_model_health(worker_name: str, change: protocol.ModelHealthChange) -> None:
    """A model turned degraded on a worker, or recovered: its load's row says so now (the next heartbeat
    says it again). Only a model loaded there has a row to mark."""
    ModelLoad.objects.filter(worker__name=worker_name, status=ModelLoad.Status.LOADED,
                             model__repo_id=protocol.ModelRef.parse(change["model"]).repo_id).update(
        **_health_fields(change))


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
    defaults: dict = {"status": status, "error": event.get("error") or "", **HEALTHY}  # loaded afresh, or gone
    if kind == protocol.MODEL_LOADED:
        defaults.update(loaded_at=now, last_used=now, memory_mb=event.get("memory_bytes", 0) / MIB,
                        max_model_len=event.get("max_model_len"))
    ModelLoad.objects.update_or_create(model=row, worker=worker, defaults=defaults)
    if kind != protocol.MODEL_LOADING:
        action = LoadEvent.Action.UNLOAD if kind == protocol.MODEL_UNLOADED else LoadEvent.Action.LOAD
        LoadEvent.objects.create(model_name=event["model"], model=row, worker=worker, action=action,
                                 requested_by=event.get("requested_by", ""), duration_s=event.get("duration_s"),
                                 error=event.get("error") or "")


def mark_lost_workers(lost_after: float | None = None) -> list[str]:
    """Workers silent for too long are lost; what they held counts as not loaded."""
    lost_after = settings.INFERENCE.fleet.worker_lost_after if lost_after is None else lost_after
    cutoff = timezone.now() - timedelta(seconds=lost_after)
    lost = list(Worker.objects.filter(status=Worker.Status.ONLINE, last_heartbeat__lt=cutoff))
    for worker in lost:
        worker.status = Worker.Status.LOST
        worker.memory_used_mb = 0.0
        worker.save(update_fields=["status", "memory_used_mb"])
        ModelLoad.objects.filter(worker=worker).exclude(status=ModelLoad.Status.UNLOADED).update(
            status=ModelLoad.Status.UNLOADED, **HEALTHY)
        logger.warning("worker %s lost: no heartbeat since %s", worker.name, worker.last_heartbeat)
    return [w.name for w in lost]


def stop_worker(name: str) -> None:
    Worker.objects.filter(name=name).update(status=Worker.Status.STOPPED, memory_used_mb=0.0)
    ModelLoad.objects.filter(worker__name=name).exclude(status=ModelLoad.Status.UNLOADED).update(
        status=ModelLoad.Status.UNLOADED, **HEALTHY)
