"""The worker's Channels consumer: a thin adapter between the channel layer and the engine.

Bound to the shared worker channel (one job goes to one worker), to the group of all
workers (cancellations, unloads and catalog settings reach every worker) and to its own
channel (control messages for this worker). Each handler is a few lines: where a job runs
is `routing`, the engine hand-over is `bridge`, the catalog's rows are `catalog_sync`.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket

from channels.consumer import AsyncConsumer, get_handler_name
from channels.layers import get_channel_layer
from channels.utils import await_many_dispatch
from django.conf import settings

from . import catalog_sync, protocol
from .bridge import EngineBridge
from .config import EngineConfig
from .routing import EMPTY_TABLE, JobClaims, RoutingTable, choose_worker

logger = logging.getLogger(__name__)


class InferenceConsumer(AsyncConsumer):
    worker_name = f"{socket.gethostname()}:{os.getpid()}"

    async def __call__(self, scope, receive, send):
        # As AsyncConsumer.__call__, plus joining the group and keeping the catalog's rows.
        self.scope = scope
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        self.channel_name = await self.channel_layer.new_channel()
        self.channel_receive = functools.partial(self.channel_layer.receive, self.channel_name)
        self.config = settings.INFERENCE
        self.catalog_settings: dict[str, protocol.ModelSettings] = {}
        self.routing: RoutingTable = EMPTY_TABLE
        self.claims = JobClaims(self.channel_layer)
        self._bridge: EngineBridge | None = None
        await self.channel_layer.group_add(self.config["WORKER_GROUP"], self.channel_name)
        upkeep = asyncio.ensure_future(self._keep_catalog())
        try:
            await await_many_dispatch([receive, self.channel_receive], self.dispatch)
        finally:
            upkeep.cancel()
            await catalog_sync.say_stopped(self.worker_name)

    async def dispatch(self, message: dict) -> None:
        # As AsyncConsumer.dispatch without closing old DB connections first: handlers never
        # touch the database themselves (catalog_sync does, in its own threads).
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    @property
    def bridge(self) -> EngineBridge:
        # Created on the first job: an idle worker has not even imported torch.
        if self._bridge is None:
            self._bridge = EngineBridge(self.channel_layer, self.worker_name, EngineConfig.from_settings(self.config),
                                        self.catalog_settings,
                                        functools.partial(catalog_sync.record_change, self.worker_name))
        return self._bridge

    async def _keep_catalog(self) -> None:
        """Join the catalog, take its settings, preload flagged models, then beat until stopped."""
        welcome = await catalog_sync.join(self.worker_name, self.channel_name, self.config["DEVICE"],
                                          self.config["WORKER_MEMORY_BUDGET_MB"] or None)
        if welcome is not None:
            self.catalog_settings = welcome.settings
            for name in welcome.preload:
                self.bridge.control(protocol.control_message(protocol.MODEL_LOAD, name, None, "preload"))
        while True:
            await asyncio.sleep(self.config["HEARTBEAT_SECONDS"])
            loaded = self._bridge.engine.manager.snapshot() if self._bridge is not None else {}
            self.routing = await catalog_sync.beat(self.worker_name, loaded) or self.routing

    async def model_settings(self, message: protocol.SettingsMessage) -> None:
        self.catalog_settings = message.get("settings") or {}
        if self._bridge is not None:
            self._bridge.engine.control(message)

    async def model_load(self, message: protocol.ControlMessage) -> None:
        self.bridge.control(message)

    async def model_unload(self, message: protocol.ControlMessage) -> None:
        if self._bridge is not None:
            self._bridge.control(message)
        elif message.get("reply_channel"):  # nothing loaded here: say so at once
            await self.channel_layer.send(message["reply_channel"], protocol.progress_message(
                self.worker_name, {"status": "not_loaded", "model": message["model"]}))

    async def generation_submit(self, message: protocol.SubmitMessage) -> None:
        if self.config["ROUTE_JOBS"] and not message.get("routed"):
            held = self._bridge.engine.models if self._bridge is not None else {}
            target = choose_worker(message["model"], self.channel_name, held, self.routing)
            if target is not None:  # one hop at most: the receiver takes it whatever its table says
                await self.channel_layer.send(target, {**message, "routed": True})
                return
        if not await self.claims.first_time(message["request_id"]):
            logger.info("dropped a second copy of %s", message["request_id"])
            return
        self.bridge.submit(message)

    async def generation_cancel(self, message: protocol.CancelMessage) -> None:
        if self._bridge is not None:
            self._bridge.engine.cancel(message["request_id"])
