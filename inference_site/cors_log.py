"""A CORS preflight that django-cors-headers refuses is answered 200 without CORS headers and logged nowhere,
so an operator sees a browser front end fail with nothing in the log (issue 49, item 11). This logs it."""
import logging

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

logger = logging.getLogger(__name__)


def log_if_refused(request, response) -> None:
    """A preflight (OPTIONS with Origin and Access-Control-Request-Method) answered without an allowed origin."""
    origin = request.headers.get("Origin")
    if (request.method == "OPTIONS" and origin and "Access-Control-Request-Method" in request.headers
            and "access-control-allow-origin" not in response.headers):
        logger.warning("CORS preflight from origin %s to %s refused: the origin is not allowed "
                       "(serve --cors-allow-origins / INFERENCE_CORS_ORIGINS)", origin, request.path)


class RefusedPreflightLogMiddleware:
    """Outside CorsMiddleware: sees its answer to a preflight. Sync and async, as Django asks."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self._acall(request)
        response = self.get_response(request)
        log_if_refused(request, response)
        return response

    async def _acall(self, request):
        response = await self.get_response(request)
        log_if_refused(request, response)
        return response
