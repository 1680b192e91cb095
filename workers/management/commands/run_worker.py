import asyncio
import signal

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from protocol.version import version_line
from workers.management.vllm_flags import add_engine_flags, engine_flag_changes
from workers.adapter.runtime import run_worker


class Command(BaseCommand):
    help = "Run a generation worker that takes jobs from the channel layer (set CHANNEL_LAYER_URL=redis://…)."

    def get_version(self) -> str:
        import django

        return version_line(django.get_version())

    def add_arguments(self, parser):
        add_engine_flags(parser)

    def handle(self, *args, **options):
        # vLLM's engine flags override the environment's settings: set in it, and the settings read again.
        changes = engine_flag_changes(options, settings.INFERENCE.engine.prefix_cache_bytes)
        if changes:
            try:
                settings.INFERENCE = settings.INFERENCE.updated(changes)
            except ValueError as exc:  # inference_site.inference_settings.SettingError, naming the variable
                raise CommandError(str(exc)) from None
        backend = settings.CHANNEL_LAYERS["default"]["BACKEND"]
        if backend.endswith("InMemoryChannelLayer"):
            self.stderr.write(self.style.WARNING(
                "The in-process channel layer cannot reach a separate web server: set CHANNEL_LAYER_URL=redis://… "
                "(or use `manage.py serve`, which runs a worker beside the server)."
            ))
        self.stdout.write(f"worker listening on channel {settings.INFERENCE.fleet.worker_channel!r} via {backend}")
        asyncio.run(_until_signalled())


async def _until_signalled() -> None:
    """SIGTERM (supervisord, systemd) or SIGINT stops the worker gracefully (its jobs run on for
    INFERENCE_SHUTDOWN_GRACE_SECONDS, the rest end with an error their clients see) and it marks itself
    stopped; a second signal stops it at once."""
    stop = asyncio.Event()
    worker = asyncio.ensure_future(run_worker(engine_first=True, stop=stop))
    loop = asyncio.get_running_loop()

    def signalled() -> None:
        if stop.is_set():
            worker.cancel()
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, signalled)
    try:
        await worker
    except asyncio.CancelledError:
        pass
