"""The door's `queue_full` for a scale-out web process (`serve --no-worker`), as for `serve` with its worker.

With the engine beside it, the door reads the engine's capacity directly. A web process without one reads
what the live workers say they can still admit (each writes its free slots to the catalog at every
heartbeat), off the request path every REFRESH_SECONDS: it lets in what it had in flight at that reading
plus the fleet's free slots then, and answers the rest 503 `queue_full` at once, instead of a round trip
through Redis to a worker that would answer the same. It is an estimate, as stale as the heartbeats (other
web processes' requests since are not seen); while no live worker reports its slots it refuses nothing.
"""
from __future__ import annotations

import asyncio
import logging

from asgiref.sync import sync_to_async

from .admission import AdmissionLimit

logger = logging.getLogger(__name__)
REFRESH_SECONDS = 1.0


class FleetCapacity:
    """`AdmissionLimit.capacity` for a web process without a worker: read from the catalog, cached."""

    def __init__(self, door: AdmissionLimit, refresh_seconds: float = REFRESH_SECONDS) -> None:
        self.door = door
        self.refresh_seconds = refresh_seconds
        self.value: int | None = None

    def __call__(self) -> int | None:
        return self.value

    def refresh(self) -> None:
        """One catalog read (a worker thread: it queries the database)."""
        from catalog.selectors import live_workers

        slots = [worker.free_slots for worker in live_workers()]
        known = bool(slots) and all(slot is not None for slot in slots)
        self.value = self.door.in_flight + sum(slots) if known else None

    async def keep_fresh(self) -> None:
        """Refresh forever; a failed read refuses nothing until the next one works."""
        while True:
            try:
                await sync_to_async(self.refresh, thread_sensitive=False)()
            except Exception as exc:  # the database away: the workers still answer queue_full themselves
                self.value = None
                logger.warning("could not read the workers' free slots: %s", exc)
            await asyncio.sleep(self.refresh_seconds)


def watch_the_fleet(door: AdmissionLimit) -> FleetCapacity:
    """Give `door` the fleet's capacity and start refreshing it (call on the server's event loop)."""
    capacity = FleetCapacity(door)
    door.capacity = capacity
    asyncio.get_event_loop().create_task(capacity.keep_fresh())
    return capacity
