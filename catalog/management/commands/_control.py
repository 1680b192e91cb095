"""What `preload` and `unload` share: a control message out, the workers' answers back."""
from __future__ import annotations

import asyncio

from channels.layers import get_channel_layer
from django.conf import settings
from django.core.management.base import CommandError

from catalog.selectors import resolve_model_id
from catalog.errors import CatalogError
from workers import protocol


def resolve(name: str) -> str:
    if settings.CHANNEL_LAYERS["default"]["BACKEND"].endswith("InMemoryChannelLayer"):
        raise CommandError("No worker is reachable from here with the in-process channel layer: set "
                           "CHANNEL_LAYER_URL=redis://… (or use POST /load_model, /unload_model or the admin).")
    try:
        repo = resolve_model_id(name)
    except CatalogError as exc:
        raise CommandError(exc.message) from exc
    return protocol.ModelRef.parse(repo).key


async def control(kind: str, name: str, timeout: float, write) -> list[dict]:
    """Send a model.load (to one worker) or model.unload (to all); write each event; return them."""
    layer = get_channel_layer()
    reply = await layer.new_channel("reply.")
    message = protocol.control_message(kind, name, reply, "command")
    if kind == protocol.MODEL_LOAD:
        await layer.send(settings.INFERENCE["WORKER_CHANNEL"], message)
    else:
        await layer.group_send(settings.INFERENCE["WORKER_GROUP"], message)
    events = []
    try:
        async with asyncio.timeout(timeout):
            while True:
                answer = await layer.receive(reply)
                if answer.get("type") != protocol.MODEL_PROGRESS:
                    continue
                write(f"{answer.get('worker')}: {answer['event']}")
                events.append(answer["event"])
                if kind == protocol.MODEL_LOAD and protocol.is_terminal(answer["event"]):
                    return events
    except TimeoutError:
        if not events:
            raise CommandError(f"No worker answered within {timeout:.0f}s.") from None
    return events
