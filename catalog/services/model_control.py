"""The load/unload round trip with the workers: a request sent and left, or its answers awaited.

Control messages (`protocol.control`) go to one worker's channel, the shared worker channel
(whichever worker takes it) or the group of all workers.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings

import protocol

from ..errors import NoWorker
from ..models import ModelLoad, Worker
from ..selectors import live_workers


def _send(channel: str, message: dict) -> None:
    async_to_sync(get_channel_layer().send)(channel, message)


def send_to_all_workers(message: dict) -> None:
    """To the group of every worker (settings, unloads): each acts on it."""
    async_to_sync(get_channel_layer().group_send)(settings.INFERENCE.fleet.worker_group, message)


def _load_channel(worker: Worker | None) -> str:
    """A given worker's own channel, else the shared one (whichever worker takes it)."""
    return worker.channel_name if worker is not None and worker.channel_name else settings.INFERENCE.fleet.worker_channel


def request_load(model: protocol.ModelRef, requested_by: str, worker: Worker | None = None) -> str:
    """Ask one worker to load a model without waiting for it; returns where it went."""
    _send(_load_channel(worker), protocol.control_message(protocol.MODEL_LOAD, model, None, requested_by))
    return worker.name if worker is not None else "any worker"


def request_unload(model: protocol.ModelRef, requested_by: str) -> None:
    """Ask every worker to unload a model; a worker refuses while the model is generating."""
    send_to_all_workers(protocol.control_message(protocol.MODEL_UNLOAD, model, None, requested_by))


def request_reload(model: protocol.ModelRef, requested_by: str) -> list[str]:
    """Load a model afresh (a degraded one, say) without waiting: each live worker holding it is asked to unload
    it and then to load it again, both on that worker's own channel, so in that order; its record of recent
    failures starts anew. Held nowhere: one worker loads it. Returns where it went. A worker refuses the
    unload while the model is generating (it keeps the loaded copy)."""
    holders = [worker for worker in live_workers() if worker.channel_name and ModelLoad.objects.filter(
        worker=worker, model__repo_id=model.repo_id, status=ModelLoad.Status.LOADED).exists()]
    if not holders:
        return [request_load(model, requested_by)]
    for worker in holders:
        _send(worker.channel_name, protocol.control_message(protocol.MODEL_UNLOAD, model, None, requested_by))
        _send(worker.channel_name, protocol.control_message(protocol.MODEL_LOAD, model, None, requested_by))
    return [worker.name for worker in holders]


async def load_model(model: protocol.ModelRef, requested_by: str, *, ack_timeout: float, event_timeout: float,
                     worker: Worker | None = None) -> AsyncIterator[protocol.ControlAccepted | protocol.ProgressMessage]:
    """The round trip of a load: the worker's acceptance, then its progress until a terminal event.

    Raises NoWorker when nobody accepts within `ack_timeout`; a worker silent for `event_timeout`
    ends the stream with an error event of its own (code worker_timeout).
    """
    layer = get_channel_layer()
    reply = await layer.new_channel("reply.")
    await layer.send(_load_channel(worker), protocol.control_message(protocol.MODEL_LOAD, model, reply, requested_by))
    try:
        async with asyncio.timeout(ack_timeout):
            message = await layer.receive(reply)
    except TimeoutError:
        raise NoWorker(f"No worker accepted the load of {model} within {ack_timeout:.0f}s.") from None
    while True:
        yield message
        if message.get("type") == protocol.MODEL_PROGRESS and protocol.is_terminal(message["event"]):
            return
        try:
            async with asyncio.timeout(event_timeout):
                message = await layer.receive(reply)
        except TimeoutError:
            yield protocol.progress_message(message.get("worker", ""), {
                "status": "error", "model": model.key, "message": "The worker stopped answering.",
                "code": "worker_timeout"})
            return


async def unload_model(model: protocol.ModelRef, requested_by: str, *, timeout: float,
                       answers: int | None = None) -> AsyncIterator[protocol.ProgressMessage]:
    """The round trip of an unload: every worker's answer, until `answers` came (None: all within `timeout`)."""
    layer = get_channel_layer()
    reply = await layer.new_channel("reply.")
    await layer.group_send(settings.INFERENCE.fleet.worker_group,
                           protocol.control_message(protocol.MODEL_UNLOAD, model, reply, requested_by))
    deadline = asyncio.get_running_loop().time() + timeout
    received = 0
    while answers is None or received < answers:
        try:
            async with asyncio.timeout_at(deadline):  # never around the yield: the caller's work is not timed
                message = await layer.receive(reply)
        except TimeoutError:
            return
        received += 1
        yield message
