"""`serve`'s background upkeep of the catalog: rescans on a schedule, silent workers marked lost."""
from __future__ import annotations

import asyncio
import logging
import time

from channels.db import database_sync_to_async
from django.conf import settings

from .services import cached_models, worker_registry

logger = logging.getLogger(__name__)


async def maintain_catalog() -> None:
    """Runs beside the web server (with or without a worker), so a lost worker is noticed by the web side too."""
    last_scan = time.monotonic()
    while True:
        config = settings.INFERENCE.fleet
        await asyncio.sleep(config.heartbeat_seconds)
        try:
            await database_sync_to_async(worker_registry.mark_lost_workers)()
            if config.scan_interval > 0 and time.monotonic() - last_scan >= config.scan_interval:
                last_scan = time.monotonic()
                result = await database_sync_to_async(cached_models.scan_cache)()
                if result.added or result.gone:
                    logger.info("cache rescan: %s", result)
        except Exception:
            logger.warning("catalog upkeep failed", exc_info=True)
