"""`serve`'s background upkeep of the catalog: rescans on a schedule, silent workers marked lost."""
from __future__ import annotations

import asyncio
import logging
import time

from channels.db import database_sync_to_async
from django.conf import settings

from . import services

logger = logging.getLogger(__name__)


async def maintain_catalog() -> None:
    """Runs beside the web server (with or without a worker), so a lost worker is noticed by the web side too."""
    config = settings.INFERENCE
    last_scan = time.monotonic()
    while True:
        await asyncio.sleep(config["HEARTBEAT_SECONDS"])
        try:
            await database_sync_to_async(services.mark_lost_workers)()
            if config["SCAN_INTERVAL"] > 0 and time.monotonic() - last_scan >= config["SCAN_INTERVAL"]:
                last_scan = time.monotonic()
                result = await database_sync_to_async(services.scan_cache)()
                if result.added or result.gone:
                    logger.info("cache rescan: %s", result)
        except Exception:
            logger.warning("catalog upkeep failed", exc_info=True)
