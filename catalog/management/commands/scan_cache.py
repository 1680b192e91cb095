from django.core.management.base import BaseCommand

from catalog.services.cached_models import scan_cache


class Command(BaseCommand):
    help = "Rescan the Hugging Face cache into the model catalog (new repos added, vanished ones marked gone)."

    def handle(self, *args, **options):
        result = scan_cache()
        for repo_id in result.added:
            self.stdout.write(f"added   {repo_id}")
        for repo_id in result.gone:
            self.stdout.write(f"gone    {repo_id}")
        self.stdout.write(f"scanned: {result}")
