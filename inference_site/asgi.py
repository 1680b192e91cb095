"""ASGI entry point: Django over HTTP; the worker consumer on the inference channel."""
import os

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inference_site.settings")
# Static files (the admin's CSS) are served by the app itself: no web server in front needed.
django_asgi_app = ASGIStaticFilesHandler(get_asgi_application())

from channels.routing import ChannelNameRouter, ProtocolTypeRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from workers.consumers import InferenceConsumer  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "channel": ChannelNameRouter(
            {settings.INFERENCE["WORKER_CHANNEL"]: InferenceConsumer.as_asgi()}
        ),
    }
)
