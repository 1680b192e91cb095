"""The worker's Channels consumer: a thin adapter between the channel layer and the engine.

Bound to the shared worker channel (one job goes to one worker), to the group of all
workers (cancellations, unloads and catalog settings reach every worker) and to its own
channel (control messages for this worker). Each handler is a few lines: where a job runs
is `routing`, the engine hand-over is `bridge`, the catalog's rows are `catalog_sync`.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket

from channels.consumer import AsyncConsumer, get_handler_name
from channels.layers import get_channel_layer
from channels.utils import await_many_dispatch
from django.conf import settings

from protocol.layer_errors import LAYER_ERRORS

import protocol
from protocol import failpoints
from protocol.tasks import watch
from workers.adapter import catalog_sync
from workers.adapter.bridge import EngineBridge
from workers.adapter.resilience import retrying
from workers.adapter.routing import EMPTY_TABLE, JobClaims, PassedJobs, RoutingTable, Unconfirmed, choose_worker

DRAIN_SECONDS = 2.0  # a dying worker's last errors get this long to reach their clients
# A worker that has just started waits this long at most for its first routing table before it chooses
# where a job runs: with none it would run every job itself, loading a model a live worker already holds.
FIRST_TABLE_SECONDS = 2.0


def _warm_up() -> None:
    from workers.engine.warmup import warm_up

    warm_up()


class WorkerDead(RuntimeError):
    """The engine (or a task the worker cannot run without) died: the process exits to be restarted."""

logger = logging.getLogger(__name__)


class InferenceConsumer(AsyncConsumer):
    worker_name = f"{socket.gethostname()}:{os.getpid()}"
    running: InferenceConsumer | None = None  # this process's consumer, while it runs (`serve`'s door reads it)

    async def __call__(self, scope, receive, send):
        # As AsyncConsumer.__call__, plus joining the group and keeping the catalog's rows.
        self.scope = scope
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        self.channel_name = await self.channel_layer.new_channel()
        self.channel_receive = retrying(functools.partial(self.channel_layer.receive, self.channel_name),
                                        "worker's own channel", reconnect=self._join_group)
        self.config = settings.INFERENCE  # typed groups (inference_site/inference_settings.py)
        self.catalog_settings: dict[str, protocol.ModelSettings] = {}
        self.routing: RoutingTable = EMPTY_TABLE
        self.routing_known = asyncio.Event()  # set once the catalog gave this worker a table
        self.claims = JobClaims(self.channel_layer, self.channel_name)
        self.passed = PassedJobs()
        self.unconfirmed = Unconfirmed(self.config.fleet.worker_lost_after)
        self._tasks: set[asyncio.Task] = set()
        self._bridge: EngineBridge | None = None
        self.dead: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.stopping = False  # a graceful stop began: jobs that still come are refused
        self._preloading: set[str] | None = None  # models to load before this worker is ready (None: not joined yet)
        # Readiness (issue 49): the engine and what a first load imports lazily are warmed now, not on the first job.
        self._engine_import = asyncio.ensure_future(asyncio.to_thread(_warm_up))
        await self._join_group()
        InferenceConsumer.running = self
        upkeep = watch(self._keep_catalog(), "the worker's catalog heartbeat", self._die)
        dispatching = asyncio.ensure_future(await_many_dispatch([receive, self.channel_receive], self.dispatch))
        try:
            await asyncio.wait({dispatching, self.dead}, return_when=asyncio.FIRST_COMPLETED)
            if self.dead.done():
                if self._bridge is not None:
                    await self._bridge.drained(DRAIN_SECONDS)
                raise WorkerDead(self.dead.result())
            dispatching.result()
        finally:
            if InferenceConsumer.running is self:
                InferenceConsumer.running = None
            dispatching.cancel()
            upkeep.cancel()
            with contextlib.suppress(Exception):  # a worker started after it in this process (serve) joins anew
                await self.channel_layer.group_discard(self.config.fleet.worker_group, self.channel_name)
            await catalog_sync.say_stopped(self.worker_name)

    def _memory_budget_mb(self) -> float | None:
        """INFERENCE_WORKER_MEMORY_BUDGET_MB as the catalog keeps it (None: no budget; the machine's memory)."""
        budget = self.config.engine.memory_budget_bytes
        return budget / catalog_sync.MIB if budget else None

    def _die(self, reason: str) -> None:
        if not self.dead.done():
            logger.critical("worker %s stops: %s", self.worker_name, reason)
            self.dead.set_result(reason)

    async def _join_group(self) -> None:
        """Group membership lives in the layer: joined at start and again after a Redis restart."""
        await self.channel_layer.group_add(self.config.fleet.worker_group, self.channel_name)

    async def dispatch(self, message: dict) -> None:
        # As AsyncConsumer.dispatch without closing old DB connections first: handlers never
        # touch the database themselves (catalog_sync does, in its own threads).
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            logger.warning("ignored a message of unknown type %r", message.get("type"))
            return
        try:
            await handler(message)
        except LAYER_ERRORS:  # the layer went away mid-message: the web side times out and answers 503
            logger.warning("channel layer unreachable while handling %s", message.get("type"), exc_info=True)
        except Exception:  # one bad message never stops the worker
            logger.exception("handling %s failed", message.get("type"))

    @property
    def bridge(self) -> EngineBridge:
        # Created on the first job: an idle worker has not even imported torch.
        if self._bridge is None:
            self._bridge = EngineBridge(self.channel_layer, self.worker_name, self.config.engine,
                                        self.catalog_settings, self._record_change,
                                        self.config.jobs.worker_keepalive_seconds)
            self._bridge.dead.add_done_callback(lambda dead: self._die(dead.result()))
        return self._bridge

    async def _started_bridge(self) -> EngineBridge:
        """The bridge, torch imported in a thread first (once) so the loop keeps answering meanwhile."""
        if self._bridge is None:
            await asyncio.shield(self._engine_import)
        return self.bridge

    async def _keep_catalog(self) -> None:
        """Join the catalog, take its settings, preload flagged models, then beat until stopped.

        Joining is retried every beat: a worker may start before the web side has migrated the
        database, or while the database is down.
        """
        while (welcome := await catalog_sync.join(self.worker_name, self.channel_name, self.config.engine.device,
                                                  self._memory_budget_mb())) is None:
            await asyncio.sleep(self.config.fleet.heartbeat_seconds)
        self.catalog_settings = welcome.settings
        self._preloading = {protocol.ModelRef.parse(name).key for name in welcome.preload}
        self._route_by(welcome.routing)  # before any preload: jobs go to the live holders meanwhile
        if welcome.preload:
            await self._started_bridge()
        for name in welcome.preload:
            self.bridge.control(protocol.control_message(protocol.MODEL_LOAD, protocol.ModelRef(name), None, "preload"))
        while True:  # the first beat at once: a restarted worker routes its first jobs to the live holders
            try:
                await failpoints.ahit("worker.heartbeat")
                loaded = self._bridge.engine.manager.snapshot() if self._bridge is not None else {}
                health = self._bridge.model_health.records() if self._bridge is not None else {}
                self._route_by(await catalog_sync.beat(self.worker_name, loaded, self._free_slots(), health))
            except Exception:  # a missed beat is retried at the next; the catalog calls the worker lost only after several
                logger.exception("the heartbeat of worker %s failed", self.worker_name)
            await asyncio.sleep(self.config.fleet.heartbeat_seconds)

    def _route_by(self, table: RoutingTable | None) -> None:
        if table is not None:
            self.routing = table
            self.routing_known.set()

    def capacity(self) -> int | None:
        """Jobs the engine runs and queues at once (None: not started); more are refused `queue_full`."""
        if self._bridge is None:
            return None
        engine = self._bridge.engine
        return engine.max_num_seqs + engine.config.max_queue

    def _free_slots(self) -> int | None:
        if self._bridge is None:
            return None
        engine = self._bridge.engine
        return max(0, engine.max_num_seqs + engine.config.max_queue - engine.outstanding)

    async def model_settings(self, message: protocol.SettingsMessage) -> None:
        self.catalog_settings = message.get("settings") or {}
        if self._bridge is not None:
            self._bridge.engine.control(message)

    async def model_load(self, message: protocol.ControlMessage) -> None:
        if self._bridge is None:  # acknowledged at once; starting the engine takes a while
            if message.get("reply_channel"):
                await self.channel_layer.send(message["reply_channel"],
                                              protocol.control_accepted(self.worker_name))
            self._in_background(self._control_when_started(message))
            return
        self.bridge.control(message)

    async def _control_when_started(self, message: protocol.ControlMessage) -> None:
        (await self._started_bridge()).control(message, acknowledged=True)

    async def model_unload(self, message: protocol.ControlMessage) -> None:
        if self._bridge is not None:
            self._bridge.control(message)
        elif message.get("reply_channel"):  # nothing loaded here: say so at once
            await self.channel_layer.send(message["reply_channel"], protocol.progress_message(
                self.worker_name, {"status": "not_loaded", "model": protocol.ModelRef.from_wire(message["model"]).key}))

    async def stop_gracefully(self, grace: float) -> None:
        """SIGINT/SIGTERM: take nothing new, let the jobs held here run on for `grace` seconds, end the rest
        with a `server_shutting_down` error (their clients' streams end with it and `[DONE]`), carry the last
        messages out, then stop the engine's threads, so the process exits 0 and never mid-forward."""
        self.stopping = True
        bridge = self._bridge
        if bridge is None:
            return
        deadline = asyncio.get_running_loop().time() + grace
        while bridge.engine.outstanding and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        if bridge.engine.outstanding:
            ended = bridge.end_all(protocol.shutting_down_message())
            logger.warning("stopping: ended %d jobs still running after %gs with server_shutting_down", ended, grace)
        await bridge.drained(DRAIN_SECONDS)
        await bridge.stop(DRAIN_SECONDS)
        logger.info("worker %s: engine stopped", self.worker_name)

    async def generation_submit(self, message: protocol.SubmitMessage) -> None:
        if self.stopping:  # said at once: the web side answers its client (or another worker takes it next time)
            await self.channel_layer.send(message["reply_channel"], protocol.shutting_down_message())
            return
        # Passed here by another worker: confirm at once, whatever becomes of it here. The confirmation
        # says "a live worker has it"; a copy this worker already took (the layer can deliver a shared
        # channel's message twice) or a cancelled job is dropped below, and left unconfirmed the passer
        # would take this live worker for dead and stop passing it jobs.
        if message.get("route_ack"):
            await self.channel_layer.send(message["route_ack"], protocol.route_ack_message(message["request_id"]))
        if message["request_id"] in self.claims.taken:
            logger.info("dropped %s: taken here already, or cancelled (its client stopped waiting)",
                        message["request_id"])
            return
        # The in-process layer reaches no other worker (a channel in the catalog from an earlier
        # process is dead), so only a layer shared between processes routes.
        if (self.config.fleet.route_jobs and not message.get("routed")
                and getattr(self.channel_layer, "connection", None) is not None):
            await self._pass_or_take(message)
            return
        await self._take(message)

    async def _pass_or_take(self, message: protocol.SubmitMessage) -> None:
        if not self.routing_known.is_set():  # just started: which workers hold what is not known yet
            try:
                async with asyncio.timeout(FIRST_TABLE_SECONDS):
                    await self.routing_known.wait()
            except TimeoutError:
                pass
        held = self._bridge.engine.models if self._bridge is not None else {}
        table = self.unconfirmed.filter(self.routing)
        here_full = self._bridge is not None and not self._bridge.engine.has_room()
        target = choose_worker(protocol.ModelRef.from_wire(message["model"]), self.channel_name, held, table, here_full,
                               affinity=message["params"].get("prompt_cache_key"))
        if target is None:
            await self._take(message)
            return
        # One hop at most: the receiver takes it whatever its table says.
        self.passed.expect(message["request_id"])
        try:
            await self.channel_layer.send(target, protocol.routed_job(message, self.channel_name))
        except BaseException:
            self.passed.confirm(message["request_id"], expected=False)
            raise
        self._in_background(self._take_unless_confirmed(message, target))

    async def generation_route_ack(self, message: protocol.RouteAckMessage) -> None:
        self.passed.confirm(message["request_id"])

    async def _take_unless_confirmed(self, message: protocol.SubmitMessage, target: str) -> None:
        """A receiver that does not confirm died since the last heartbeat (or is slow): it is left out of
        this worker's choices until it beats again (`Unconfirmed`), and the job goes to another holder (or
        is run here)."""
        if await self.passed.confirmed(message["request_id"], self.config.fleet.route_ack_timeout):
            return
        claimed_by = await self.claims.claimed_by(message["request_id"])
        if claimed_by == target:  # it runs the job: alive, only its confirmation came late
            logger.info("%s: the worker it was passed to confirmed it late, but has it", message["request_id"])
            return
        logger.warning("%s: the worker it was passed to (%s) did not confirm it; %s", message["request_id"], target,
                       "passing it on again or running it here" if claimed_by is None else f"claimed by {claimed_by}")
        self.unconfirmed.add(target, self.routing)
        if claimed_by is None:  # nobody has it yet
            await self._pass_or_take(message)

    async def _take(self, message: protocol.SubmitMessage) -> None:
        if not await self.claims.first_time(message["request_id"]):
            logger.info("dropped a second copy of %s", message["request_id"])
            return
        if self._bridge is None:  # acknowledged at once; starting the engine takes a while
            await self.channel_layer.send(message["reply_channel"], protocol.accepted_message(self.worker_name))
            self._in_background(self._submit_when_started(message))
            return
        self.bridge.submit(message)

    async def _submit_when_started(self, message: protocol.SubmitMessage) -> None:
        """While the engine starts, the job's reply channel hears that this worker is alive."""
        ticker = asyncio.ensure_future(self._say_alive(message["reply_channel"]))
        try:
            bridge = await self._started_bridge()
        finally:
            ticker.cancel()
        bridge.submit(message, acknowledged=True)

    async def _say_alive(self, reply_channel: str) -> None:
        while True:
            await asyncio.sleep(self.config.jobs.worker_keepalive_seconds)
            await self.channel_layer.send(reply_channel, protocol.alive_message())

    def _in_background(self, work) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("background work failed", exc_info=task.exception())

    async def _record_change(self, change: protocol.ModelChange | protocol.ModelHealthChange) -> None:
        """A model change (or a model turned degraded or back) goes to the catalog; a preloaded model's load,
        done or failed, ends its wait."""
        if change["type"] in ("model.loaded", "model.load_failed") and self._preloading:
            self._preloading -= {change["model"], protocol.ModelRef.parse(change["model"]).key}
        await catalog_sync.record_change(self.worker_name, change)

    def not_ready(self) -> str | None:
        """Why this worker cannot serve a request at once yet (readiness), or None."""
        if not self._engine_import.done():
            return "starting: the engine is warming up"
        if self._engine_import.exception() is not None:
            return f"the engine cannot start: {self._engine_import.exception()}"
        if self._preloading is None:
            return "starting: not yet joined the catalog"
        if self._preloading:
            return "starting: loading " + ", ".join(sorted(self._preloading))
        return None

    async def worker_ping(self, message: protocol.PingMessage) -> None:
        """/health asks: answered from the event loop with the engine thread's own liveness (its loop's
        heartbeat, workers/engine/core/supervision.py), so a dead or stalled engine is reported, not hidden;
        and with its readiness: the engine warmed up and the pinned and preloaded models loaded (or failed)."""
        problem = (self._bridge.problem() if self._bridge is not None else None) or self.not_ready()
        degraded = self._bridge.model_health.degraded() if self._bridge is not None else {}
        await self.channel_layer.send(message["reply_channel"], protocol.pong_message(self.worker_name, problem, degraded))

    async def generation_cancel(self, message: protocol.CancelMessage) -> None:
        if message["request_id"] not in self.claims.taken:  # not here (yet): if it comes later, drop it
            self.claims.cancelled(message["request_id"])
        if self._bridge is not None:
            self._bridge.cancel(message["request_id"])
