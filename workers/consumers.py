"""The worker's Channels consumer: a thin adapter between the channel layer and the engine.

Bound to the shared worker channel (one job goes to one worker) and to the
group of all workers (cancellations reach whichever worker holds the job).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket

from channels.consumer import AsyncConsumer
from channels.layers import get_channel_layer
from channels.consumer import get_handler_name
from channels.utils import await_many_dispatch
from django.conf import settings

from . import protocol

logger = logging.getLogger(__name__)


class EngineBridge:
    """Owns the process's engine and carries its messages back onto the channel layer in order."""

    _instance: "EngineBridge | None" = None

    def __init__(self, layer) -> None:
        from .engine import Engine  # torch is imported only once a worker really starts

        config = settings.INFERENCE
        self.layer = layer
        self.loop = asyncio.get_running_loop()
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.engine = Engine(self._emit, device=config["DEVICE"], dtype=config["DTYPE"],
                             torch_threads=config["TORCH_THREADS"], max_num_seqs=config["MAX_NUM_SEQS"],
                             max_queue=config["MAX_QUEUE"], prefill_chunk=config["PREFILL_CHUNK"])
        self.sender = self.loop.create_task(self._send_forever())
        self.engine.start()

    @classmethod
    def get(cls, layer) -> "EngineBridge":
        if cls._instance is None:
            cls._instance = cls(layer)
        return cls._instance

    def _emit(self, channel: str, message: dict) -> None:
        """Called from the engine thread."""
        self.loop.call_soon_threadsafe(self.outbox.put_nowait, (channel, message))

    def send(self, channel: str, message: dict) -> None:
        """Called from the event loop; shares the outbox so a reply channel sees messages in order."""
        self.outbox.put_nowait((channel, message))

    async def _send_forever(self) -> None:
        while True:
            channel, message = await self.outbox.get()
            try:
                await self.layer.send(channel, message)
            except Exception:  # a full or vanished reply channel must not stop the worker
                logger.warning("could not deliver %s to %s", message.get("type"), channel, exc_info=True)


class InferenceConsumer(AsyncConsumer):
    worker_name = f"{socket.gethostname()}:{os.getpid()}"

    async def __call__(self, scope, receive, send):
        # As AsyncConsumer.__call__, plus joining the group that carries cancellations.
        self.scope = scope
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        self.channel_name = await self.channel_layer.new_channel()
        self.channel_receive = functools.partial(self.channel_layer.receive, self.channel_name)
        await self.channel_layer.group_add(settings.INFERENCE["WORKER_GROUP"], self.channel_name)
        await await_many_dispatch([receive, self.channel_receive], self.dispatch)

    async def dispatch(self, message: dict) -> None:
        # As AsyncConsumer.dispatch without closing old DB connections first: this consumer
        # never touches the database, and that check costs a thread hop per job.
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    @property
    def bridge(self) -> EngineBridge:
        # Created on the first job: an idle worker has not even imported torch.
        return EngineBridge.get(self.channel_layer)

    async def generation_submit(self, message: dict) -> None:
        bridge = self.bridge
        if not bridge.engine.has_room():
            # Bounded admission: a full worker says so at once instead of queueing without end.
            bridge.send(message["reply_channel"], protocol.error_message(
                503, "The server is at capacity: too many requests are queued. Retry shortly.",
                None, "queue_full", retry_after=1))
            return
        bridge.send(message["reply_channel"], {"type": protocol.ACCEPTED, "worker": self.worker_name})
        bridge.engine.submit(message)

    async def generation_cancel(self, message: dict) -> None:
        if EngineBridge._instance is not None:
            self.bridge.engine.cancel(message["request_id"])
