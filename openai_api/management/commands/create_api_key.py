from django.core.management.base import BaseCommand

from openai_api.keys import issue_key


class Command(BaseCommand):
    help = "Create an API key; the secret is printed once and stored only as a hash."

    def add_arguments(self, parser):
        parser.add_argument("name", help="who or what the key is for")

    def handle(self, *args, name: str, **options):
        key, raw_key = issue_key(name)
        self.stderr.write(f"Created API key {key.prefix}… for {name!r}. Store it now; it is not shown again:")
        self.stdout.write(raw_key)
