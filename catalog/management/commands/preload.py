import asyncio

from django.core.management.base import BaseCommand, CommandError

import protocol

from ._control import control, resolve


class Command(BaseCommand):
    help = "Load a model on a worker now (over CHANNEL_LAYER_URL) and print its load events."

    def add_arguments(self, parser):
        parser.add_argument("model")
        parser.add_argument("--timeout", type=float, default=600.0)

    def handle(self, *args, model: str, timeout: float, **options):
        name = resolve(model)
        events = asyncio.run(control(protocol.MODEL_LOAD, name, timeout, self.stdout.write))
        if events[-1].get("status") != "ready":
            raise CommandError(f"{name.key} did not load: {events[-1].get('message')}")
        self.stdout.write(f"{name.key} loaded")
