"""The default team (no limits), and every key of the old flat table moved into it, hashes unchanged,
so keys issued before teams existed (`serve`'s local key among them) keep working."""
from django.db import migrations
from django.utils import timezone


def forwards(apps, schema_editor):
    Team = apps.get_model("teams", "Team")
    APIKey = apps.get_model("teams", "APIKey")
    OldKey = apps.get_model("openai_api", "APIKey")
    team, _ = Team.objects.get_or_create(name="default")
    now = timezone.now()
    for old in OldKey.objects.all():
        key = APIKey.objects.create(team=team, name=old.name, prefix=old.prefix, hashed_key=old.hashed_key,
                              last_used_at=old.last_used_at, revoked_at=now if old.revoked else None)
        APIKey.objects.filter(pk=key.pk).update(created_at=old.created_at)  # not auto_now_add's "now"


def backwards(apps, schema_editor):
    APIKey = apps.get_model("teams", "APIKey")
    OldKey = apps.get_model("openai_api", "APIKey")
    for key in APIKey.objects.all():
        OldKey.objects.create(name=key.name, prefix=key.prefix, hashed_key=key.hashed_key,
                              last_used_at=key.last_used_at, revoked=key.revoked_at is not None)


class Migration(migrations.Migration):
    dependencies = [("teams", "0001_initial"), ("openai_api", "0001_initial")]

    operations = [migrations.RunPython(forwards, backwards)]
