"""The web side of the request path: a job goes out on the channel layer, events come back.

Views use `open_generation(...)` and iterate the returned stream; they never see
torch or the engine, only the plain messages of `protocol`. A stream opened with a
team meter (`teams.metering.RequestMeter`) is admitted before its job goes out, reserves its
tokens once the worker has counted the prompt, and settles and writes its ledger row when it
closes: `cancel()` ends every request, whichever way it went.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass

from channels.layers import get_channel_layer
from django.conf import settings

from teams.metering import RequestMeter
import protocol
from protocol import failpoints
from protocol.random_ids import random_hex
from protocol.tasks import watch

from .errors import APIError, client_error
from .silence import SilenceWatch, receive_within

logger = logging.getLogger(__name__)
CLIENT_CLOSED = 499  # as nginx logs a client that left before its response
HANDOFF_SECONDS = 5.0  # a stream the view handed on must be taken up by then, else its client is gone
JOIN_AT_MOST = 8  # messages joined into one event: a stream read late still moves in steps, not all at once


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{random_hex()}"


@dataclass
class Collected:
    """A whole answer: each choice's deltas joined (in index order), and the usage."""

    choices: list[protocol.ChoiceDelta]
    usage: protocol.Usage


class WorkerLost(Exception):
    """The job's reply channel was silent past WORKER_SILENCE_TIMEOUT: its worker died (or is cut off)."""


def worker_lost() -> APIError:
    return APIError(503, "The worker running this request stopped answering (it may have crashed); retry.",
                    code="worker_lost", headers={"Retry-After": "1"})


def no_worker() -> APIError:
    return APIError(503, "No inference worker is available to take the request; try again later.",
                    code="no_worker", headers={"Retry-After": "5"})


class GenerationStream:
    """Events of one job, read from its reply channel; `cancel()` stops the job on its worker.

    Workers keep a job's reply channel from going silent, so silence means the worker died.
    A job that had produced nothing yet is then sent again under a fresh request id and reply
    channel, routed like a new job (a worker that reads it passes it to a live holder of its model,
    so a worker just restarted does not load a copy for it; a holder that died since the last
    heartbeat costs one ROUTE_ACK_TIMEOUT); one that had ends with a 503 `worker_lost`. Either way
    no client waits more than a few seconds on a dead worker.
    """

    def __init__(self, layer, job: protocol.SubmitMessage) -> None:
        self.layer = layer
        self.job = job
        self.request_id = job["request_id"]
        self.reply_channel = job["reply_channel"]
        self.started: protocol.Started | dict = {}
        self.meter: RequestMeter | None = None
        self.finished = False
        self.error: APIError | None = None
        self.produced = False  # an event reached the view: the job can no longer be sent again
        self.resubmits = 0
        self.claimed = False  # the response began reading it (whoever claims it cancels it at the end)
        self.responding = False  # its response started (a stream's status and headers went out)
        self._held: list[dict] = []  # messages read ahead of a joined delta, next in line
        self._silence: SilenceWatch | None = None  # the waits of `_next`, bounded by the worker's silence timeout
        OPEN_STREAMS.add(self)

    async def open(self) -> None:
        """Submit the job and wait until a worker has validated it and started generating."""
        config = settings.INFERENCE.jobs
        # A job still queued when the wait below ends (no worker was up) must not run later: giving up
        # cancels it (send_cancel claims its id first and tells the workers, who remember it).
        await self.layer.send(settings.INFERENCE.fleet.worker_channel, self.job)
        try:
            accepted = await self._first_answer(time.monotonic() + config.worker_ack_timeout)
            started = await self._next() if accepted.get("type") == protocol.ACCEPTED else accepted
        except TimeoutError:
            await send_cancel(self.layer, self.request_id)
            raise no_worker() from None
        except asyncio.CancelledError:
            await send_cancel(self.layer, self.request_id)
            raise
        if started.get("type") == protocol.ERROR:
            raise worker_error(started)
        if started.get("type") != protocol.STARTED:
            raise APIError(500, "The worker sent an unexpected message.", code="worker_protocol")
        self.started = self.started or started

    async def _first_answer(self, deadline: float) -> dict:
        """A worker's first word on the job (its acknowledgement, or an error), by `deadline`.

        Workers acknowledge a job the moment they read it, so one unanswered for
        WORKER_SILENCE_TIMEOUT was most likely read by a worker that died as it took it (kill -9
        between Redis popping the job and the worker answering): it goes out again under a new id
        (the old one cancelled everywhere) while resubmits are left. TimeoutError at the deadline.
        """
        config = settings.INFERENCE.jobs
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            try:
                return await receive_within(self.layer, self.reply_channel, min(left, config.worker_silence_timeout))
            except TimeoutError:
                if deadline - time.monotonic() <= 0 or self.resubmits >= config.job_resubmits:
                    continue
                await self._prepare_resubmit()
                await self.layer.send(settings.INFERENCE.fleet.worker_channel, self.job)

    async def open_or_resubmit(self) -> None:
        """`open()`, sending the job again each time its worker is lost before it starts."""
        while True:
            try:
                return await self.open()
            except WorkerLost:
                await self._prepare_resubmit()

    async def _prepare_resubmit(self) -> None:
        if self.produced or self.resubmits >= settings.INFERENCE.jobs.job_resubmits:
            self.finished = True
            self.error = worker_lost()
            raise self.error from None
        logger.warning("the worker of %s went silent before its first token; sending it again", self.request_id)
        await send_cancel(self.layer, self.request_id)  # in case it was only cut off, not dead
        self._held.clear()
        self.resubmits += 1
        self.request_id = f"{self.job['request_id'].split('~')[0]}~{self.resubmits}"
        self.reply_channel = await self.layer.new_channel("reply.")
        self.job = {**self.job, "request_id": self.request_id, "reply_channel": self.reply_channel}

    async def _next(self) -> dict:
        """The next message that is not a keepalive; WorkerLost after a silence, worker_timeout
        after WORKER_EVENT_TIMEOUT of keepalives only (a worker alive but stuck)."""
        if not self._held:
            self._take_ready()
        if self._held:
            return self._held.pop(0)
        config = settings.INFERENCE.jobs
        loop = asyncio.get_running_loop()
        deadline = loop.time() + config.worker_event_timeout
        if self._silence is None:
            self._silence = SilenceWatch(config.worker_silence_timeout)
        while True:
            try:
                message = await self._silence.receive(self.layer, self.reply_channel)
            except TimeoutError:
                raise WorkerLost() from None
            if message.get("type") != protocol.ALIVE:
                return message
            if loop.time() > deadline:
                self.error = APIError(503, "The worker stopped answering.", code="worker_timeout")
                raise self.error

    async def events(self) -> AsyncIterator[protocol.DeltaMessage | protocol.DoneMessage]:
        """Yield delta events until the job is done; raise APIError for a worker error or a lost worker.

        The meter counts an event once its reader comes back for the next one: by then the response
        has handed it on (a stream's frame went to the client), so a client cut off mid-stream is
        billed the tokens it was sent, not the ones generated for it. Whatever ends the stream with an
        error is kept as `error`, what the client is told and what the ledger records."""
        self.claimed = True
        try:
            while not self.finished:
                try:
                    event = await self._next()
                except WorkerLost:
                    await self._prepare_resubmit()
                    await self.open_or_resubmit()
                    continue
                event = self._join_ready(event)
                kind = event.get("type")
                if kind == protocol.ERROR:
                    self.finished = True
                    self.error = worker_error(event)
                    raise self.error
                if kind == protocol.DONE:
                    self.finished = True
                self.produced = True
                if self.meter is not None:
                    self.meter.handing_on(event)
                yield event
                if self.meter is not None:
                    self.meter.observe(event)
        except Exception as exc:
            self.error = self.error or client_error(exc)
            raise

    def _take_ready(self) -> None:
        """Hold what already waits on the reply channel (a layer that can tell: the embedded one), so a
        stream read behind its worker takes it without a timer and a wait each."""
        ready = getattr(self.layer, "receive_ready", None)
        if ready is not None:
            self._held.extend(m for m in ready(self.reply_channel) if m.get("type") != protocol.ALIVE)

    def _join_ready(self, event: dict) -> dict:
        """`event` with the deltas (and the done) that already wait behind it on the reply channel
        joined in (up to JOIN_AT_MOST messages): a stream whose reader fell behind gets one event, one SSE
        frame and one write for them, not one each (adaptive: a reader that keeps up joins nothing)."""
        if event.get("type") != protocol.DELTA:
            return event
        self._take_ready()
        if not self._held or not all(_joinable(m) for m in (event, self._held[0])):
            return event
        merged: dict[int, protocol.ChoiceDelta] = {}
        for delta in event["choices"]:
            merge_delta(merged, delta)
        last: dict = event
        for _ in range(JOIN_AT_MOST - 1):
            if not self._held or not _joinable(self._held[0]) or last["type"] != protocol.DELTA:  # up to a done
                break
            last = self._held.pop(0)
            for delta in last["choices"]:
                merge_delta(merged, delta)
        return {**last, "choices": [merged[index] for index in sorted(merged)]}

    async def collect(self) -> Collected:
        """Drain the stream into the non-streamed answer (the streamed one joined); cancels if cut short."""
        merged: dict[int, protocol.ChoiceDelta] = {}
        usage = None
        try:
            async for event in self.events():
                for delta in event.get("choices", ()):
                    merge_delta(merged, delta)
                usage = event.get("usage", usage)
        finally:
            await self.cancel()
        return Collected([merged[index] for index in sorted(merged)], usage)

    async def cancel(self) -> None:
        """End the request: stop the job if it still runs, then settle its tokens and ledger row with what
        the client saw: the error it was told, or — ended early without one, so its client left —
        `client_closed`, under 200 once its response had started (a stream), else 499."""
        left = not self.finished and self.error is None
        if self._silence is not None:
            self._silence.close()
        if not self.finished:
            self.finished = True
            await send_cancel(self.layer, self.request_id)
        if self.meter is not None:
            error = self.error
            if error is not None:
                await self.meter.finish(error.status, error.code or "")
            elif left:
                await self.meter.finish(200 if self.responding else CLIENT_CLOSED, "client_closed", cancelled=True)
            else:
                await self.meter.finish(200)


def _joinable(message: dict) -> bool:
    """A delta or done of generated tokens (not a transcription's words, an embedding or a score)."""
    return message.get("type") in (protocol.DELTA, protocol.DONE) and not any(
        key in delta for delta in message["choices"] for key in ("words", "embedding", "score"))


def merge_delta(merged: dict[int, protocol.ChoiceDelta], delta: protocol.ChoiceDelta) -> None:
    """Accumulate one choice's deltas."""
    current = merged.get(delta["index"])
    if current is None:
        merged[delta["index"]] = {**delta, "token_ids": list(delta["token_ids"]),
                                  "logprobs": _copy_logprobs(delta["logprobs"])}
        if "parts" in delta:
            merged[delta["index"]]["parts"] = list(delta["parts"])
        return
    current["text"] += delta["text"]
    if "parts" in delta:
        current.setdefault("parts", []).extend(delta["parts"])
    current["token_ids"].extend(delta["token_ids"])
    if delta.get("prompt_logprobs") is not None:
        current["prompt_logprobs"] = delta["prompt_logprobs"]
    current["finish_reason"] = delta["finish_reason"] or current["finish_reason"]
    if delta["logprobs"] is not None:
        if current["logprobs"] is None:
            current["logprobs"] = _copy_logprobs(delta["logprobs"])
        else:
            for key, values in delta["logprobs"].items():
                current["logprobs"][key].extend(values)


def _copy_logprobs(logprobs: protocol.Logprobs | None) -> protocol.Logprobs | None:
    return None if logprobs is None else {key: list(values) for key, values in logprobs.items()}


def worker_error(event: protocol.ErrorMessage) -> APIError:
    retry_after = event.get("retry_after")
    headers = {"Retry-After": str(retry_after)} if retry_after else None
    return APIError(event["status"], event["message"], event.get("param"), event.get("code"), headers)


CANCELLED_CLAIM_SECONDS = 300  # as long as a worker's claim (workers.adapter.routing.CLAIM_SECONDS)


async def send_cancel(layer, request_id: str) -> None:
    """Stop a job wherever it is: its id is claimed in the layer as cancelled (so a worker that reads it
    later from the shared channel, even one that starts after this, drops it) and the workers' group
    hears the cancel (a worker running it stops; the others remember the id)."""
    try:
        connection = getattr(layer, "connection", None)
        if connection is not None:  # a shared (Redis) layer; in one process the group's memory suffices
            key = layer.prefix + protocol.claim_key(request_id)
            await connection(layer.consistent_hash(key)).set(key, "cancelled", nx=True, ex=CANCELLED_CLAIM_SECONDS)
        await layer.group_send(
            settings.INFERENCE.fleet.worker_group, protocol.cancel_message(request_id))
    except Exception:  # the client is gone either way; a lost cancel only wastes a slot
        logger.exception("could not send cancel for %s", request_id)


async def open_generation(request_id: str, model: protocol.ModelRef, prompts: list[protocol.Prompt],
                          params: protocol.JobParams, meter: RequestMeter | None = None) -> GenerationStream:
    """Submit a job and wait until a worker has validated it and started generating.

    Raises APIError with the worker's status (400 for a prompt over the context,
    404 for a model the worker cannot load, 503 when no worker answers), or the meter's
    LimitExceeded (429) before the job goes out or once its tokens are known.
    """
    if meter is None:
        return await _open(request_id, model, prompts, params)
    team, params = for_principal(meter, params)
    try:
        await meter.admit()
        stream = await _open(request_id, model, prompts, params, team)
    except asyncio.CancelledError:
        await asyncio.shield(meter.finish(CLIENT_CLOSED, "client_closed", cancelled=True))
        raise
    except Exception as exc:  # refused (a limit, the worker's answer) or failed (an outage): as the client hears it
        error = client_error(exc)
        await meter.finish(error.status, error.code or "")
        raise
    stream.meter = meter
    try:
        await meter.reserve(stream.started, params.max_tokens, params.n)
    except Exception as exc:
        stream.meter = None  # nothing was generated for the client: the job stops, nothing is charged
        await stream.cancel()
        error = client_error(exc)
        await meter.finish(error.status, error.code or "")
        raise
    meter.opened()
    settle_unless_claimed(stream)
    await failpoints.ahit("web.handoff")
    return stream


def for_principal(meter: RequestMeter, params: protocol.JobParams) -> tuple[protocol.TeamRef, protocol.JobParams]:
    """The job's team (name and fair-share weight) and its params as the principal's key sets them:
    every request of a `batch` key runs at batch priority, whatever it asked."""
    principal = meter.principal
    team: protocol.TeamRef = {"name": principal.team.name, "share": principal.team.share}
    if principal.key is not None and principal.key.service_tier == "batch" and params.priority_class != "batch":
        params = dataclasses.replace(params, priority_class="batch")
    return team, params


def settle_unless_claimed(stream: GenerationStream, within: float = HANDOFF_SECONDS) -> None:
    """A client that vanishes after the view returns and before its response starts reading the
    stream leaves no code to end it (Django drops the unstarted response): this does, so the job
    stops and its parallel slot and tokens are settled within seconds, not at the lease's end."""
    def check() -> None:
        if not stream.claimed and not stream.finished:
            logger.warning("the client of %s left before its response started; settling it", stream.request_id)
            watch(stream.cancel(), f"settling {stream.request_id}")

    asyncio.get_running_loop().call_later(within, check)


async def _open(request_id: str, model: protocol.ModelRef, prompts: list[protocol.Prompt],
                params: protocol.JobParams, team: protocol.TeamRef | None = None) -> GenerationStream:
    layer = get_channel_layer()
    reply_channel = await layer.new_channel("reply.")
    stream = GenerationStream(layer, protocol.submit_message(request_id, reply_channel, model, prompts, params, team))
    # In the request's log context: ties its X-Request-Id to the job id the worker's lines name.
    logger.info("job %s submitted for %s", request_id, model)
    await stream.open_or_resubmit()
    return stream


OPEN_STREAMS: weakref.WeakSet[GenerationStream] = weakref.WeakSet()  # every job this process waits on


async def end_open_streams() -> int:
    """A graceful stop's last word (inference_site/graceful_stop.py): every job still unfinished here hears an
    OpenAI-shaped 503 `server_shutting_down` on its own reply channel, so its client's stream ends with that
    error event and `[DONE]` instead of a cut connection. How many were ended."""
    ended = 0
    for stream in list(OPEN_STREAMS):
        if stream.finished:
            continue
        try:
            await stream.layer.send(stream.reply_channel, protocol.shutting_down_message())
            ended += 1
        except Exception:  # the layer is down: Daphne's own stop cuts this one
            logger.warning("could not end %s before the stop", stream.request_id, exc_info=True)
    return ended
