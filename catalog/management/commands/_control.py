"""What `preload` and `unload` share: the name resolved, then catalog.services.model_control's round trip."""
from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.core.management.base import CommandError

from catalog.services import model_control
from catalog.errors import CatalogError, NoWorker
from catalog.selectors import resolve_model
import protocol


def resolve(name: str) -> protocol.ModelRef:
    if settings.CHANNEL_LAYERS["default"]["BACKEND"].endswith("InMemoryChannelLayer"):
        raise CommandError("No worker is reachable from here with the in-process channel layer: set "
                           "CHANNEL_LAYER_URL=redis://… (or use POST /load_model, /unload_model or the admin).")
    try:
        return resolve_model(name)
    except CatalogError as exc:
        raise CommandError(exc.message) from exc


async def control(kind: str, name: protocol.ModelRef, timeout: float, write: Callable[[str], None]) -> list[protocol.ModelEvent]:
    """A model.load (one worker) or model.unload (every worker): write each event; return them."""
    if kind == protocol.MODEL_LOAD:
        messages = model_control.load_model(name, "command", ack_timeout=timeout, event_timeout=timeout)
    else:
        messages = model_control.unload_model(name, "command", timeout=timeout)
    events = []
    try:
        async for message in messages:
            if message.get("type") == protocol.MODEL_PROGRESS:
                write(f"{message.get('worker')}: {message['event']}")
                events.append(message["event"])
    except NoWorker:
        pass
    if not events:
        raise CommandError(f"No worker answered within {timeout:.0f}s.")
    return events
