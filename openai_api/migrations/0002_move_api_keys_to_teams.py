"""API keys now belong to teams (teams.APIKey); their rows were copied there first."""
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("openai_api", "0001_initial"), ("teams", "0002_default_team_and_old_keys")]

    operations = [migrations.DeleteModel(name="APIKey")]
