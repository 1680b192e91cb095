import asyncio

from django.core.management.base import BaseCommand

import protocol

from ._control import control, resolve


class Command(BaseCommand):
    help = "Unload a model from every worker (over CHANNEL_LAYER_URL); prints each worker's answer."

    def add_arguments(self, parser):
        parser.add_argument("model")
        parser.add_argument("--wait", type=float, default=3.0, help="seconds to collect answers")

    def handle(self, *args, model: str, wait: float, **options):
        name = resolve(model)
        events = asyncio.run(control(protocol.MODEL_UNLOAD, name, wait, self.stdout.write))
        unloaded = sum(1 for e in events if e.get("status") == "unloaded")
        self.stdout.write(f"{name.key} unloaded from {unloaded} worker(s)")
