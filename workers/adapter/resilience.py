"""Channel-layer reads that outlive a Redis restart: retry with backoff, never exit for it.

channels-redis raises `redis.ConnectionError` from a blocked `receive` when the server goes
away and on every call while it is down, then works again once it is back (its pool
reconnects). A worker therefore retries, with a capped exponential backoff, and first redoes
what the restart lost (group membership lives in Redis) before it reads again.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from protocol.layer_errors import LAYER_ERRORS

logger = logging.getLogger(__name__)
FIRST_DELAY_SECONDS = 0.1
MAX_DELAY_SECONDS = 1.0

Receive = Callable[[], Awaitable[dict]]


async def until_it_works(action: Callable[[], Awaitable[object]], what: str) -> None:
    """Run `action` until it stops raising a layer error, waiting longer (up to a cap) each time."""
    delay = FIRST_DELAY_SECONDS
    while True:
        try:
            await action()
            return
        except LAYER_ERRORS as exc:
            logger.debug("%s: channel layer still unreachable (%s)", what, exc)
            await asyncio.sleep(delay)
            delay = min(MAX_DELAY_SECONDS, delay * 2)


def retrying(receive: Receive, what: str, reconnect: Callable[[], Awaitable[object]] | None = None) -> Receive:
    """`receive` that rides out an unreachable layer; after an outage `reconnect` runs first."""

    async def receive_retrying() -> dict:
        delay = 0.0
        while True:
            try:
                message = await receive()
            except LAYER_ERRORS as exc:
                if not delay:
                    logger.warning("%s: channel layer unreachable (%s); reconnecting with backoff", what, exc)
                delay = min(MAX_DELAY_SECONDS, delay * 2 or FIRST_DELAY_SECONDS)
                await asyncio.sleep(delay)
                if reconnect is not None:
                    await until_it_works(reconnect, what)
                continue
            if delay:
                logger.info("%s: channel layer reachable again", what)
            return message

    return receive_retrying
