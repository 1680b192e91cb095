"""ASGI entry point.

HTTP: the OpenAI API is served by a Django handler without the admin's session,
CSRF, auth and messages middleware (each costs a thread hop per request, and the
API authenticates in DRF: bearer keys, or a page's session cookie read only when sent);
/admin/, /static/ and the browser pages (settings.FULL_STACK_PATHS) get the full stack.
Every HTTP request passes the guard first (inference_site.guard: size limits, request id,
security headers, the access line). Channel: the worker consumer on the inference channel.
"""
import os

from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application
from django.core.handlers.asgi import ASGIHandler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inference_site.settings")
full_django_app = ASGIStaticFilesHandler(get_asgi_application())


class APIHandler(ASGIHandler):
    """Django with settings.API_MIDDLEWARE instead of settings.MIDDLEWARE."""

    def load_middleware(self, is_async: bool = False) -> None:
        full_stack = settings.MIDDLEWARE
        settings.MIDDLEWARE = settings.API_MIDDLEWARE
        try:
            super().load_middleware(is_async)
        finally:
            settings.MIDDLEWARE = full_stack


from inference_site.admission import AdmissionLimit  # noqa: E402

api_app = AdmissionLimit(APIHandler(), settings.INFERENCE["WEB_MAX_IN_FLIGHT"])


async def http_app(scope, receive, send):
    path = scope.get("path", "")
    if path.startswith(settings.FULL_STACK_PATHS) or path in settings.FULL_STACK_EXACT_PATHS:
        return await full_django_app(scope, receive, send)
    return await api_app(scope, receive, send)


from channels.routing import ChannelNameRouter, ProtocolTypeRouter  # noqa: E402

from inference_site.guard import RequestGuard  # noqa: E402

from workers.adapter.consumers import InferenceConsumer  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": RequestGuard(http_app),
        "channel": ChannelNameRouter(
            {settings.INFERENCE["WORKER_CHANNEL"]: InferenceConsumer.as_asgi()}
        ),
    }
)
