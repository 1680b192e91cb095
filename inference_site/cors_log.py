"""A CORS preflight the API refuses is logged as such (issue 49): django-cors-headers answers a preflight from
an origin it does not allow with a plain 200 and no CORS headers, so the browser refuses the call and the
server's log said only `OPTIONS 200`. Placed before CorsMiddleware in settings.API_MIDDLEWARE."""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase

logger = logging.getLogger(__name__)


def is_refused_preflight(request: HttpRequest, response: HttpResponseBase) -> bool:
    """An OPTIONS preflight (Origin and Access-Control-Request-Method) answered without an allowed origin."""
    return (request.method == "OPTIONS" and "HTTP_ORIGIN" in request.META
            and "HTTP_ACCESS_CONTROL_REQUEST_METHOD" in request.META
            and not response.has_header("Access-Control-Allow-Origin"))


class RefusedPreflightLog:
    """Logs a refused preflight with the origin and how to allow it; the answer itself is unchanged."""

    async_capable = True
    sync_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], Awaitable[HttpResponseBase]]) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    async def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = await self.get_response(request)
        if is_refused_preflight(request, response):
            logger.warning("CORS preflight from origin %s refused for %s %s: the origin is not allowed "
                           "(allow it with serve --cors-allow-origins ORIGIN, or INFERENCE_CORS_ORIGINS)",
                           request.META["HTTP_ORIGIN"], request.META["HTTP_ACCESS_CONTROL_REQUEST_METHOD"],
                           request.path)
        return response
