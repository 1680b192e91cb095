from django.core.management.base import BaseCommand

from workers.tiny_models import build_tiny_model


class Command(BaseCommand):
    help = "Build a causal LM with random weights and a trained tokenizer into the Hugging Face cache (offline)."

    def add_arguments(self, parser):
        parser.add_argument("name", help="repo id to write, e.g. local/tiny-llama")
        parser.add_argument("--size", choices=["tiny", "small"], default="tiny")
        parser.add_argument("--seed", type=int, default=0)

    def handle(self, *args, name: str, size: str, seed: int, **options):
        path = build_tiny_model(name, size=size, seed=seed)
        self.stdout.write(f"built {size} model {name} at {path}")
