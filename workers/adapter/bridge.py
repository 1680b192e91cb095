"""The hand-over between the engine's thread and the worker's event loop.

The engine emits from its own thread; the bridge carries each message onto the channel
layer in order, one loop wake-up per step. It also admits jobs (a full worker says so at
once; a job's media are read first, off the loop) and relays the engine's model changes to
whoever records them. While it holds a job it
keeps the job's reply channel from going silent (`generation.alive`), so the web side can tell
a dead worker by silence within seconds; a job whose reply channel cannot be reached (Redis
down) is cancelled rather than generated for nobody — and its reply channel hears nothing more
from this worker: a channel that lost a message must not get the ones after it (a delta after a
lost `started`, the rest of an answer after a lost delta), or its client would get a protocol
error or an answer with a hole in it. Silence instead lets the web side send the job again (or end
it with `worker_lost`) as it does for a dead worker.

Nothing here fails unseen: its background tasks are watched (`workers.tasks.watch`), a job whose
media cannot be read for any reason is answered, and an engine that dies (workers/supervision.py)
resolves `dead`, which the worker's consumer waits on to stop the process.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import protocol
from protocol import failpoints
from protocol.tasks import watch
from workers.adapter.model_health import ModelHealth
from workers.engine.config import EngineConfig

logger = logging.getLogger(__name__)

RecordChange = Callable[[protocol.ModelChange | protocol.ModelHealthChange], Awaitable[None]]
# Errors that say nothing of the model: the server full, stopping, or its worker's layer gone.
NOT_THE_MODELS = frozenset({"queue_full", "server_shutting_down", "channel_layer_unavailable", "server_busy"})
CUT_OFF_CHANNELS = 10_000  # reply channels remembered as cut off (each job has its own; the oldest are forgotten)


class EngineBridge:
    """Owns one engine and carries its messages back onto the channel layer in order."""

    def __init__(self, layer, name: str, config: EngineConfig, model_settings: dict[str, protocol.ModelSettings],
                 record_change: RecordChange, keepalive_seconds: float = 1.0) -> None:
        from workers.engine.core.engine import Engine  # torch is imported only once a worker really starts

        self.layer = layer
        self.name = name
        self.loop = asyncio.get_running_loop()
        self.outbox: asyncio.Queue = asyncio.Queue()  # lists of (channel, message), in order
        self._pending: list[tuple[str, dict]] = []  # emitted by the engine thread, not yet in the outbox
        self._pending_lock = threading.Lock()
        self._changes: asyncio.Queue = asyncio.Queue()
        self._record_change = record_change
        self.keepalive_seconds = keepalive_seconds
        self._held: dict[str, tuple[str, float]] = {}  # reply channel -> (request id, last sent), until done
        self._cut_off: OrderedDict[str, None] = OrderedDict()  # reply channels that lost a message: silent now
        self.model_health = ModelHealth()  # each model's recent failures (degraded: /health, the catalog)
        self._job_models: dict[str, str] = {}  # reply channel -> its job's model, until it ends
        self._last_word: dict[str, dict] = {}  # reply channels a graceful stop ended: only this message goes out
        self.dead: asyncio.Future[str] = self.loop.create_future()  # why the engine or a task died
        self.engine = Engine(self._emit, config, on_model_event=self._on_model_change, name=name,
                             on_dead=lambda reason: self.loop.call_soon_threadsafe(self._die, reason))
        self.media = config.media
        self._media_reads: set[asyncio.Task] = set()
        if model_settings:
            self.engine.control(protocol.settings_message(model_settings))
        self.sender = watch(self._send_forever(), "the worker's message sender", self._die)
        self.recorder = watch(self._record_forever(), "the worker's model-change recorder", self._die)
        self.keeper = watch(self._keep_alive_forever(), "the worker's keepalive sender", self._die)
        self.engine.start()

    def _die(self, reason: str) -> None:
        """The engine or one of this bridge's tasks died: the worker stops taking jobs and exits."""
        if not self.dead.done():
            self.dead.set_result(reason)

    def problem(self) -> str | None:
        """Why this worker cannot serve (for its ping, hence /health), or None."""
        return self.engine.problem() or (f"worker dead: {self.dead.result()}" if self.dead.done() else None)

    async def drained(self, timeout: float) -> None:
        """Wait (at most `timeout`) until every queued message went out: the last errors reach their clients."""
        deadline = time.monotonic() + timeout
        while (self._pending or not self.outbox.empty()) and time.monotonic() < deadline and not self.sender.done():
            await asyncio.sleep(0.05)

    def end_all(self, message: dict) -> int:
        """A graceful stop past its grace: every job held here is cancelled and its reply channel hears
        `message` last (whatever the engine still publishes for it is dropped). How many were ended."""
        held = list(self._held.items())
        for channel, (request_id, _) in held:
            self._last_word[channel] = message
            self.engine.cancel(request_id)
            self.send(channel, message)
        return len(held)

    async def stop(self, timeout: float) -> None:
        """The engine's threads stopped and joined (off the loop), so the process exits with none mid-forward."""
        await asyncio.to_thread(self.engine.stop, timeout)

    # --- from the event loop -----------------------------------------------------
    def submit(self, job: protocol.SubmitMessage, acknowledged: bool = False) -> None:
        """Admit a job, or refuse it at once when the worker is full (bounded admission)."""
        if self.dead.done():
            from workers.engine.core.supervision import engine_dead_message

            self.send(job["reply_channel"], engine_dead_message(self.dead.result()))
            return
        if not self.engine.has_room():
            self.send(job["reply_channel"], protocol.error_message(
                503, "The server is at capacity: too many requests are queued. Retry shortly.",
                None, "queue_full", retry_after=1))
            return
        if not acknowledged:
            self.send(job["reply_channel"], protocol.accepted_message(self.name))
        self._held[job["reply_channel"]] = (job["request_id"], time.monotonic())
        self._job_models[job["reply_channel"]] = protocol.ModelRef.from_wire(job["model"]).key
        from workers.engine.inputs.media_prompts import job_has_media

        if job_has_media(job):  # read on a thread of its own: the loop keeps carrying messages meanwhile
            task = watch(self._read_media_then_submit(job), f"reading the media of {job['request_id']}")
            self._media_reads.add(task)
            task.add_done_callback(self._media_reads.discard)
        else:
            self.engine.submit(job)

    async def _read_media_then_submit(self, job: protocol.SubmitMessage) -> None:
        from workers.media.decoding import MediaError
        from workers.engine.inputs.media_prompts import read_job_media

        def read() -> None:
            failpoints.hit("media.read")
            read_job_media(job, self.media)

        try:
            await asyncio.to_thread(read)
        except MediaError as exc:
            self.send(job["reply_channel"], protocol.error_message(exc.status, exc.message, exc.param, exc.code))
            return
        except Exception as exc:  # never a stranded job: held, kept alive, never submitted
            logger.exception("reading the media of %s failed", job["request_id"])
            self.send(job["reply_channel"], protocol.error_message(
                500, f"The worker could not read this request's media ({type(exc).__name__}).", None, "media_error"))
            return
        self.engine.submit(job)

    def cancel(self, request_id: str) -> None:
        self._held = {channel: held for channel, held in self._held.items() if held[0] != request_id}
        self.engine.cancel(request_id)

    def control(self, message: protocol.ControlMessage, acknowledged: bool = False) -> None:
        """A load or unload for the engine; a load with a reply channel is acknowledged first."""
        if message["type"] == protocol.MODEL_LOAD and message.get("reply_channel") and not acknowledged:
            self.send(message["reply_channel"], protocol.control_accepted(self.name))
        self.engine.control(message)

    def send(self, channel: str, message: dict) -> None:
        """Shares the outbox with the engine's messages, so a reply channel sees them in order."""
        self.outbox.put_nowait([(channel, message)])

    async def _send_forever(self) -> None:
        """Everything queued goes out together: one round trip per step over Redis (`send_many`)."""
        send_many = getattr(self.layer, "send_many", None)
        while True:
            items = await self.outbox.get()
            while not self.outbox.empty():
                items.extend(self.outbox.get_nowait())
            items = [(channel, message) for channel, message in items if channel not in self._cut_off
                     and self._last_word.get(channel, message) is message]
            if not items:
                continue
            try:
                await failpoints.ahit("bridge.send")
            except failpoints.FailpointError as exc:  # as if the layer had refused the whole batch
                outcomes = [exc] * len(items)
            else:
                if send_many is not None and len(items) > 1:
                    try:
                        outcomes = await send_many(items)
                    except Exception as exc:  # the layer went away: every item failed alike
                        outcomes = [exc] * len(items)
                else:
                    outcomes = [await self._send_one(channel, message) for channel, message in items]
            for (channel, message), error in zip(items, outcomes):
                try:
                    self._sent(channel, message, error)
                except Exception:  # one message's bookkeeping never stops delivery
                    logger.exception("after sending %s to %s", message.get("type"), channel)

    async def _send_one(self, channel: str, message: dict) -> Exception | None:
        try:
            await self.layer.send(channel, message)
        except Exception as exc:
            return exc
        return None

    def _sent(self, channel: str, message: dict, error: BaseException | None) -> None:
        if error is not None:  # a full or vanished reply channel must not stop the worker
            logger.warning("could not deliver %s to %s: %s", message.get("type"), channel, error)
            held = self._held.pop(channel, None)
            if held is not None:  # nobody can hear this job any more: free its slot, send its channel nothing more
                self.engine.cancel(held[0])
                self._cut_off[channel] = None  # no hole, no message out of order: silence, which the web side reads
                if len(self._cut_off) > CUT_OFF_CHANNELS:
                    self._cut_off.popitem(last=False)
            return
        if message.get("type") in (protocol.DONE, protocol.ERROR) and channel in self._job_models:
            model = self._job_models.pop(channel)
            flipped = False
            if message.get("type") == protocol.DONE:
                flipped = self.model_health.ended(model, None)
            elif (message.get("status") or 500) >= 500 and message.get("code") not in NOT_THE_MODELS:
                flipped = self.model_health.ended(model, message.get("message") or "error")
            if flipped:  # degraded, or recovered: the catalog hears it now, not at the next heartbeat
                self._changes.put_nowait(protocol.model_health_change(model, self.model_health.record(model)))
        held = self._held.get(channel)
        if held is not None:
            if message.get("type") in (protocol.DONE, protocol.ERROR):
                del self._held[channel]
            else:
                self._held[channel] = (held[0], time.monotonic())

    async def _keep_alive_forever(self) -> None:
        """Every held job's reply channel hears from this worker at least every `keepalive_seconds`."""
        while True:
            await asyncio.sleep(self.keepalive_seconds / 2)
            now = time.monotonic()
            for channel, (request_id, last_sent) in list(self._held.items()):
                if now - last_sent >= self.keepalive_seconds:
                    self._held[channel] = (request_id, now)
                    self.send(channel, protocol.alive_message())

    async def _record_forever(self) -> None:
        while True:
            change = await self._changes.get()
            try:
                await self._record_change(change)
            except Exception:  # the catalog's row is put right by the next heartbeat
                logger.exception("could not record the model change %s", change)

    # --- from the engine thread --------------------------------------------------
    def _on_model_change(self, change: protocol.ModelChange) -> None:
        if change["type"] in (protocol.MODEL_LOADED, "model.unloaded"):  # unloaded or reloaded: a fresh record
            self.loop.call_soon_threadsafe(self.model_health.forget, change["model"])
        self.loop.call_soon_threadsafe(self._changes.put_nowait, change)

    def _emit(self, channel: str, message: dict) -> None:
        """One loop wake-up carries all of a step's messages.

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
        self.outbox.put_nowait(pending)  # a step's messages as one item
