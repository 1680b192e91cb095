"""What a channel layer raises while its server is unreachable: web and workers both retry or answer 503 on these."""
from __future__ import annotations

from redis import exceptions as redis_exceptions

# channels-redis surfaces redis-py's errors; the in-memory layer only OSError.
LAYER_ERRORS: tuple[type[BaseException], ...] = (
    OSError, redis_exceptions.ConnectionError, redis_exceptions.TimeoutError, redis_exceptions.BusyLoadingError,
)
