"""A graceful stop on SIGINT or SIGTERM, for `serve` (embedded) and `serve --no-worker` (scale-out's web side).

Daphne's own stop cancels every open request at once: streams were cut mid-answer, with neither `[DONE]`
nor an error event, and the embedded engine's threads were killed mid-forward by the interpreter's exit
(`terminate called without an active exception`, exit 134). Instead, as uvicorn's and vLLM's graceful
shutdowns do: take nothing new (a 503 `server_shutting_down` at the door; `/health` says stopping), let
the streams in flight finish for INFERENCE_SHUTDOWN_GRACE_SECONDS, end the rest with an OpenAI-shaped
`server_shutting_down` error event (then `[DONE]`), stop the embedded engine's threads, and only then
let Daphne close what is left. The process exits 0. `run_worker` does the worker's half itself
(workers/management/commands/run_worker.py).
"""
from __future__ import annotations

import asyncio
import logging

from inference_site.admission import AdmissionLimit

logger = logging.getLogger(__name__)
FLUSH_SECONDS = 3.0  # ended streams get this long to send their error event and [DONE]


async def _until(condition, seconds: float) -> bool:
    """Wait at most `seconds` for `condition()`; whether it holds."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    return condition()


async def stop_gracefully(door: AdmissionLimit, grace: float) -> None:
    """Drain the generation requests counted by `door`, ending those still running after `grace` seconds;
    then stop the embedded worker's engine, if this process runs one."""
    from openai_api.generation import end_open_streams
    from openai_api.health import report_problem

    door.stopping = True
    report_problem("server", "stopping (SIGINT or SIGTERM): new requests are refused")
    logger.warning("stopping: %d generation requests in flight get %gs to finish", door.in_flight, grace)
    from workers.adapter.consumers import InferenceConsumer

    consumer = InferenceConsumer.running
    worker = asyncio.ensure_future(consumer.stop_gracefully(grace)) if consumer is not None else None
    if not await _until(lambda: door.in_flight == 0, grace + (FLUSH_SECONDS if worker is not None else 0)):
        ended = await end_open_streams()  # scale-out: the remote workers' jobs; embedded: any the worker missed
        logger.warning("stopping: ended %d streams still running after %gs with server_shutting_down", ended, grace)
        await _until(lambda: door.in_flight == 0, FLUSH_SECONDS)
    if worker is not None:
        try:
            await worker
        except Exception:  # the stop goes on: Daphne's and the engine's threads end with the process
            logger.exception("stopping the embedded worker failed")
    logger.info("stopped gracefully (%d requests still open are closed now)", door.in_flight)
