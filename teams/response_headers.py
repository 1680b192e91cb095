"""OpenAI's x-ratelimit-* headers on every response of an authenticated API view.

`RateLimitHeadersMixin` goes before adrf's APIView: once the view has answered (success or
error, JSON or a stream, whose headers leave before its first byte) the six headers are set
from the request's meter when one admitted it, else read from the counters without counting
or reserving anything (`/v1/models`, `/v1/key`, a 404, a 429). A request that never
authenticated (a 401) gets none.
"""
from __future__ import annotations

import logging

from django.db import DatabaseError
from redis.exceptions import RedisError

from .limits import current_headers
from .principal import Principal

logger = logging.getLogger(__name__)


async def rate_limit_headers(request) -> dict[str, str]:
    """The headers for a DRF request's response ({} when it is not a principal's)."""
    principal = request.__dict__.get("_auth")  # only once authentication ran: `.auth` would run it now
    if not isinstance(principal, Principal):
        return {}
    meter = request.__dict__.get("meter")
    try:
        return await (meter.rate_headers() if meter is not None else current_headers(principal.scopes))
    except (DatabaseError, RedisError, OSError) as exc:  # counters unreachable: answer without them
        logger.warning("x-ratelimit headers left out: %s", exc)
        return {}


class RateLimitHeadersMixin:
    async def async_dispatch(self, request, *args, **kwargs):
        response = await super().async_dispatch(request, *args, **kwargs)
        for name, value in (await rate_limit_headers(self.request)).items():
            response[name] = value
        return response
