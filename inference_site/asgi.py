"""ASGI entry point.

HTTP: the OpenAI API is served by a Django handler without the admin's session,
CSRF, auth and messages middleware (each costs a thread hop per request, and the
API authenticates in DRF: bearer keys, or a page's session cookie read only when sent);
/admin/, /static/ and the browser pages (settings.FULL_STACK_PATHS) get the full stack.
Every HTTP request passes the guard first (inference_site.guard: size limits, request id,
security headers, the access line). Channel: the worker consumer on the inference channel.
"""
import os

import django
from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inference_site.settings")
django.setup(set_prefix=False)  # as django.core.asgi.get_asgi_application does

from inference_site.request_threads import (  # noqa: E402
    PooledThreadsASGIHandler, RequestThreads, drop_request_started_database_check)

request_threads = RequestThreads()
drop_request_started_database_check()
full_django_app = ASGIStaticFilesHandler(PooledThreadsASGIHandler(request_threads))


class APIHandler(PooledThreadsASGIHandler):
    """Django with settings.API_MIDDLEWARE instead of settings.MIDDLEWARE."""

    def load_middleware(self, is_async: bool = False) -> None:
        full_stack = settings.MIDDLEWARE
        settings.MIDDLEWARE = settings.API_MIDDLEWARE
        try:
            super().load_middleware(is_async)
        finally:
            settings.MIDDLEWARE = full_stack


from inference_site.admission import AdmissionLimit  # noqa: E402



def record_door_refusal(path: str, authorization: bytes, status: int, code: str) -> None:
    """A generation request the door refused is a request too: its ledger row (teams.metering)."""
    from openai_api.generation import new_request_id
    from teams.metering import record_unmetered

    record_unmetered(new_request_id("door"), path, status, code, authorization=authorization)


api_app = AdmissionLimit(APIHandler(request_threads), settings.INFERENCE.edge.web_max_in_flight,
                         on_refused=record_door_refusal)


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
            {settings.INFERENCE.fleet.worker_channel: InferenceConsumer.as_asgi()}
        ),
    }
)
