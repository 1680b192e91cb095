from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from teams.services import create_team

from ._limits import add_limit_arguments, model_list


class Command(BaseCommand):
    help = "Create a team with its model list and limits (each left out: no limit)."

    def add_arguments(self, parser):
        parser.add_argument("name")
        add_limit_arguments(parser)
        parser.add_argument("--token-budget", type=int, help="tokens per budget period")
        parser.add_argument("--budget-period", type=int, default=30, metavar="DAYS", help="budget period in days (30)")
        parser.add_argument("--share", type=float, default=1.0,
                            help="weight in the engine's fair share when the box is contended (default 1; above 0)")

    def handle(self, *args, name: str, **options):
        try:
            team = create_team(name, allowed_models=model_list(options["models"]), rpm=options["rpm"],
                               tpm=options["tpm"], max_parallel=options["max_parallel"],
                               token_budget=options["token_budget"], budget_period_days=options["budget_period"],
                               share=options["share"])
        except ValidationError as exc:
            raise CommandError("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())) from None
        self.stdout.write(f"Created team {team.name!r} (id {team.pk}).")
