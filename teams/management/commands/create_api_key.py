from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from teams.models import Team
from teams.services import default_team, issue_key

from ._limits import add_limit_arguments, model_list


class Command(BaseCommand):
    help = "Create an API key in a team; the secret is printed once, on the last line, and stored only as a hash."

    def add_arguments(self, parser):
        parser.add_argument("name", help="who or what the key is for")
        parser.add_argument("--team", help="the team's name (default: the default team, which has no limits)")
        parser.add_argument("--user", help="username of the key's owner (a member of the team)")
        add_limit_arguments(parser)
        parser.add_argument("--expires-days", type=float, help="the key stops working after this many days")
        parser.add_argument("--manage-models", action="store_true",
                            help="the key may load and unload models (/load_model, /unload_model) for every team")
        parser.add_argument("--service-tier", choices=["interactive", "batch"], default="interactive",
                            help="batch: every request of the key runs at batch priority (default interactive)")

    def handle(self, *args, name: str, **options):
        try:
            team = Team.objects.get(name=options["team"]) if options["team"] else default_team()
        except Team.DoesNotExist:
            raise CommandError(f"No team named {options['team']!r} (create it with create_team).") from None
        user = None
        if options["user"]:
            user = get_user_model().objects.filter(username=options["user"]).first()
            if user is None:
                raise CommandError(f"No user named {options['user']!r}.")
        try:
            key, raw_key = issue_key(name, team, user=user, allowed_models=model_list(options["models"]),
                                     rpm=options["rpm"], tpm=options["tpm"], max_parallel=options["max_parallel"],
                                     expires_days=options["expires_days"], manage_models=options["manage_models"],
                                     service_tier=options["service_tier"])
        except ValidationError as exc:
            raise CommandError("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())) from None
        self.stderr.write(f"Created API key {key.prefix}… {name!r} in team {team.name!r}. "
                          "Store it now; it is not shown again:")
        self.stdout.write(raw_key)
