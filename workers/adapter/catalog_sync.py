"""A worker's rows in the catalog: registration, settings and preloads, heartbeats, model changes.

The only worker code that imports the catalog. The catalog is bookkeeping: a failure is logged
and generation goes on without it. Every call goes through database_sync_to_async, never from
the engine thread.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
from dataclasses import dataclass

from channels.db import database_sync_to_async

from catalog import selectors
from catalog.services import worker_registry

import protocol
from workers.adapter.routing import RoutingTable

logger = logging.getLogger(__name__)
MIB = 1024 * 1024


@dataclass
class Welcome:
    """What a worker takes from the catalog when it joins."""

    settings: dict[str, protocol.ModelSettings]
    preload: list[str]
    routing: RoutingTable


async def join(name: str, channel_name: str, device: str, memory_budget_mb: float | None) -> Welcome | None:
    """Register (marking what this worker held before as unloaded); the settings map, the models to preload,
    and the routing table at once, not at the first beat: a restarted worker passes its first jobs to the
    live holders instead of loading their model itself."""
    try:
        register = database_sync_to_async(worker_registry.register_worker)
        await register(name, socket.gethostname(), os.getpid(), channel_name, device,
                       memory_budget_mb or _system_memory_mb())
        return Welcome(await database_sync_to_async(selectors.model_settings_map)(),
                       await database_sync_to_async(selectors.preload_models)(),
                       await database_sync_to_async(selectors.routing_table)())
    except Exception as exc:  # the database is down or not migrated yet: the caller retries
        logger.warning("worker %s could not register in the catalog: %s", name, exc)
        return None


async def beat(name: str, loaded: dict[str, dict], free_slots: int | None = None,
               health: dict[str, dict] | None = None) -> RoutingTable | None:
    """The worker is alive, holds `loaded` and can admit `free_slots` more jobs, its models' recent outcomes
    `health` ({model@rev: {degraded, failed, of, last_error}}); returns the routing table."""
    try:
        await database_sync_to_async(worker_registry.heartbeat)(name, loaded, free_slots=free_slots, health=health)
        return await database_sync_to_async(selectors.routing_table)()
    except Exception:
        logger.warning("heartbeat of %s failed", name, exc_info=True)
        return None


async def record_change(name: str, change: protocol.ModelChange | protocol.ModelHealthChange) -> None:
    record = (worker_registry.record_model_health if change["type"] == protocol.MODEL_HEALTH
              else worker_registry.record_model_event)
    try:
        await database_sync_to_async(record)(name, change)
    except Exception:
        logger.warning("could not record %s", change, exc_info=True)


async def say_stopped(name: str) -> None:
    """Best effort on a clean shutdown (a killed worker is found lost by its silence instead)."""
    try:
        await asyncio.wait_for(database_sync_to_async(worker_registry.stop_worker)(name), 5)
    except BaseException:  # shutting down: never let bookkeeping block or raise
        logger.debug("could not mark %s stopped", name, exc_info=True)


def _system_memory_mb() -> float | None:
    try:
        import psutil
    except ImportError:
        return None
    return psutil.virtual_memory().total / MIB
