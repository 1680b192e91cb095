"""The worker's Channels consumer: a thin adapter between the channel layer and the engine.

Bound to the shared worker channel (one job goes to one worker), to the group of all
workers (cancellations, unloads and catalog settings reach every worker) and to its own
channel (control messages for this worker). It also keeps the worker's catalog rows:
a heartbeat every few seconds and every load/unload the engine reports, written through
database_sync_to_async here, never from the engine thread.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import socket
import threading
from collections import OrderedDict

from channels.consumer import AsyncConsumer
from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.utils import await_many_dispatch
from django.conf import settings

from . import protocol

logger = logging.getLogger(__name__)
MIB = 1024 * 1024
SEEN_JOBS = 10_000


class EngineBridge:
    """Owns the process's engine and carries its messages back onto the channel layer in order."""

    _instance: "EngineBridge | None" = None

    def __init__(self, layer, name: str = "", model_settings: dict | None = None) -> None:
        from .engine import Engine  # torch is imported only once a worker really starts

        config = settings.INFERENCE
        self.layer = layer
        self.name = name
        self.loop = asyncio.get_running_loop()
        self.outbox: asyncio.Queue = asyncio.Queue()
        self._pending: list[tuple[str, dict]] = []  # emitted by the engine thread, not yet in the outbox
        self._pending_lock = threading.Lock()
        self.model_events: asyncio.Queue = asyncio.Queue()
        budget = int(config["WORKER_MEMORY_BUDGET_MB"] * MIB) or None
        self.engine = Engine(self._emit, device=config["DEVICE"], dtype=config["DTYPE"],
                             torch_threads=config["TORCH_THREADS"], max_num_seqs=config["MAX_NUM_SEQS"],
                             max_queue=config["MAX_QUEUE"], prefill_chunk=config["PREFILL_CHUNK"],
                             model_timeout=config["MODEL_TIMEOUT"], memory_budget_bytes=budget,
                             on_model_event=self._on_model_event, name=name)
        if model_settings:
            self.engine.control({"type": protocol.MODEL_SETTINGS, "settings": model_settings})
        self.sender = self.loop.create_task(self._send_forever())
        self.recorder = self.loop.create_task(self._record_forever())
        self.engine.start()

    @classmethod
    def get(cls, layer, name: str = "", model_settings: dict | None = None) -> "EngineBridge":
        if cls._instance is None:
            cls._instance = cls(layer, name, model_settings)
        return cls._instance

    def _on_model_event(self, event: dict) -> None:
        """Called from the engine thread: a load or unload to record in the catalog."""
        self.loop.call_soon_threadsafe(self.model_events.put_nowait, event)

    async def _record_forever(self) -> None:
        from catalog import services

        while True:
            event = await self.model_events.get()
            try:
                await database_sync_to_async(services.record_model_event)(self.name, event)
            except Exception:  # the catalog is bookkeeping; generation goes on without it
                logger.warning("could not record %s", event, exc_info=True)

    def _emit(self, channel: str, message: dict) -> None:
        """Called from the engine thread; one loop wake-up carries all of a step's messages.

        The pending list is non-empty exactly while a hand-over is scheduled and not yet run.
        """
        with self._pending_lock:
            self._pending.append((channel, message))
            if len(self._pending) > 1:
                return
        self.loop.call_soon_threadsafe(self._take_pending)

    def _take_pending(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, []
        for item in pending:
            self.outbox.put_nowait(item)

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
        heartbeats = asyncio.ensure_future(self._start_and_beat())
        try:
            await await_many_dispatch([receive, self.channel_receive], self.dispatch)
        finally:
            heartbeats.cancel()
            await self._say_stopped()

    async def _say_stopped(self) -> None:
        """Best effort on a clean shutdown (a killed worker is found lost by its silence instead)."""
        from catalog import services

        try:
            await asyncio.wait_for(database_sync_to_async(services.stop_worker)(self.worker_name), 5)
        except BaseException:  # shutting down: never let bookkeeping block or raise
            logger.debug("could not mark %s stopped", self.worker_name, exc_info=True)

    async def dispatch(self, message: dict) -> None:
        # As AsyncConsumer.dispatch without closing old DB connections first: this consumer
        # never touches the database, and that check costs a thread hop per job.
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    catalog_settings: dict = {}

    @property
    def bridge(self) -> EngineBridge:
        # Created on the first job: an idle worker has not even imported torch.
        return EngineBridge.get(self.channel_layer, self.worker_name, self.catalog_settings)

    async def _start_and_beat(self) -> None:
        """Register in the catalog, take its settings, preload flagged models, then beat until stopped."""
        from catalog import selectors, services

        config = settings.INFERENCE
        db = database_sync_to_async
        try:
            budget = config["WORKER_MEMORY_BUDGET_MB"] or None
            await db(services.register_worker)(self.worker_name, socket.gethostname(), os.getpid(),
                                               self.channel_name, config["DEVICE"], budget or _system_memory_mb())
            InferenceConsumer.catalog_settings = await db(selectors.model_settings_map)()
            for name in await db(selectors.preload_models)():
                self.bridge.engine.control(protocol.control_message(protocol.MODEL_LOAD, name, None, "preload"))
        except Exception:
            logger.exception("worker %s could not register in the catalog", self.worker_name)
        while True:
            await asyncio.sleep(config["HEARTBEAT_SECONDS"])
            loaded = EngineBridge._instance.engine.manager.snapshot() if EngineBridge._instance else {}
            try:
                await db(services.heartbeat)(self.worker_name, loaded)
                await db(services.mark_lost_workers)()
                InferenceConsumer.routing = await db(selectors.routing_table)()
            except Exception:
                logger.warning("heartbeat of %s failed", self.worker_name, exc_info=True)

    async def model_settings(self, message: dict) -> None:
        InferenceConsumer.catalog_settings = message.get("settings") or {}
        if EngineBridge._instance is not None:
            self.bridge.engine.control(message)

    async def model_load(self, message: dict) -> None:
        bridge = self.bridge
        if message.get("reply_channel"):
            bridge.send(message["reply_channel"], {"type": protocol.MODEL_ACCEPTED, "worker": self.worker_name})
        bridge.engine.control(message)

    async def model_unload(self, message: dict) -> None:
        if EngineBridge._instance is not None:
            self.bridge.engine.control(message)
        elif message.get("reply_channel"):  # nothing loaded here: say so at once
            await self.channel_layer.send(message["reply_channel"], {
                "type": protocol.MODEL_PROGRESS, "worker": self.worker_name,
                "event": {"status": "not_loaded", "model": message["model"]}})

    routing: dict = {"loaded": {}, "free": {}}
    taken: "OrderedDict[str, None]" = OrderedDict()

    async def _first_time(self, request_id: str) -> bool:
        """Whether this worker may run the job: channels_redis can hand one message of a shared channel
        to two readers (django/channels_redis#163), so over Redis a worker first claims the request id
        (SET NX); a forwarded copy of a job this worker already took is dropped the same way."""
        if request_id in self.taken:
            return False
        self.taken[request_id] = None
        if len(self.taken) > SEEN_JOBS:
            self.taken.popitem(last=False)
        connection = getattr(self.channel_layer, "connection", None)
        if connection is None:  # the in-process layer delivers each message once
            return True
        key = f"{self.channel_layer.prefix}claim:{request_id}"
        return bool(await connection(self.channel_layer.consistent_hash(key)).set(key, 1, nx=True, ex=300))

    def _route(self, model: str) -> str | None:
        """Another worker's channel for a job this worker should not take, else None.

        A worker that holds the model takes it; otherwise a live worker that holds it, else the
        one with the most free memory (ties stay here). From the catalog, as of the last heartbeat.
        """
        ref = protocol.ModelRef.parse(model)
        repo_id = ref.repo_id
        held = EngineBridge._instance.engine.models if EngineBridge._instance is not None else {}
        if ref.key in held:
            return None
        holders = [c for c in self.routing["loaded"].get(repo_id, ()) if c != self.channel_name]
        if holders:
            return random.choice(holders)
        free = self.routing["free"]
        if self.channel_name not in free:
            return None
        best = max(free, key=free.get)
        return best if free[best] > free[self.channel_name] else None

    async def generation_submit(self, message: dict) -> None:
        if settings.INFERENCE["ROUTE_JOBS"] and not message.get("routed"):
            target = self._route(message["model"])
            if target is not None:  # one hop at most: the receiver takes it whatever its table says
                await self.channel_layer.send(target, {**message, "routed": True})
                return
        if not await self._first_time(message["request_id"]):
            logger.info("dropped a second copy of %s", message["request_id"])
            return
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


def _system_memory_mb() -> float | None:
    try:
        import psutil
    except ImportError:
        return None
    return psutil.virtual_memory().total / MIB
