"""Starting a worker: the consumer listens on the worker channel from the first moment.

Channels' own Worker creates a consumer only when the first job arrives; ours
starts it at once so it is in the cancellation group before any job exists. An unreachable
channel layer (Redis restarting) is waited out, never a reason to exit.
"""
from __future__ import annotations

import asyncio
import importlib
import logging

from channels.layers import get_channel_layer
from django.conf import settings

from workers.adapter import catalog_sync
from workers.adapter.consumers import InferenceConsumer
from workers.adapter.resilience import retrying

logger = logging.getLogger(__name__)


async def run_worker(engine_first: bool = False, stop: asyncio.Event | None = None) -> None:
    """Receive jobs from the shared worker channel and hand them to this process's consumer.

    With `engine_first` (a worker process of its own) torch and the engine are imported before
    the first job is taken: a worker restarted beside live ones leaves the shared channel to them
    until it can run what it takes, rather than hold jobs while it imports for seconds.
    `stop` set (SIGINT, SIGTERM): a graceful stop — the shared channel is left to other workers, the jobs
    held here run on for INFERENCE_SHUTDOWN_GRACE_SECONDS and the rest end with `server_shutting_down`.
    """
    layer = get_channel_layer()
    channel = settings.INFERENCE.fleet.worker_channel
    inbox: asyncio.Queue = asyncio.Queue()
    application = InferenceConsumer.as_asgi()
    consumer = asyncio.ensure_future(
        application({"type": "channel", "channel": channel}, inbox.get, _no_send)
    )
    logger.info("worker %s listening on channel %r", InferenceConsumer.worker_name, channel)
    if engine_first:
        await asyncio.to_thread(importlib.import_module, "workers.engine.core.engine")
    receive = retrying(lambda: layer.receive(channel), f"worker channel {channel!r}")
    stopping = asyncio.ensure_future(stop.wait() if stop is not None else asyncio.Event().wait())
    try:
        while True:
            receiving = asyncio.ensure_future(receive())
            await asyncio.wait({receiving, consumer, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if stopping.done() and not consumer.done():
                receiving.cancel()
                running = InferenceConsumer.running
                if running is not None:
                    await running.stop_gracefully(settings.INFERENCE.lifecycle.shutdown_grace_seconds)
                return
            if consumer.done():
                receiving.cancel()
                consumer.result()  # re-raise what stopped the consumer
                return
            await inbox.put(receiving.result())
    finally:
        stopping.cancel()
        # A clean stop (SIGTERM, Ctrl-C) lets the consumer mark this worker stopped in the catalog.
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)


async def _no_send(message: dict) -> None:
    raise RuntimeError("a worker consumer has no client to send to")


def engine_capacity() -> int | None:
    """Jobs this process's engine runs and queues at once; None while no engine runs here."""
    consumer = InferenceConsumer.running
    return consumer.capacity() if consumer is not None else None


def mark_stopped() -> None:
    """This process's worker stopped, in the catalog (for `serve`, once its server has stopped)."""
    asyncio.run(catalog_sync.say_stopped(InferenceConsumer.worker_name))
