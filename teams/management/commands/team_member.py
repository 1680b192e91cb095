"""`team_member add TEAM USERNAME [--role owner]` / `team_member remove TEAM USERNAME [--revoke-keys]`."""
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from teams.models import Membership, Team
from teams.services import add_member, remove_member


class Command(BaseCommand):
    help = ("Add a user to a team or remove them (idempotent: adding a member again or removing a non-member "
            "changes nothing and succeeds).")

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["add", "remove"])
        parser.add_argument("team", help="the team's name")
        parser.add_argument("username")
        parser.add_argument("--role", choices=[Membership.MEMBER, Membership.OWNER], default=None,
                            help="add: the member's role (default member; given, it also changes an existing one's)")
        parser.add_argument("--revoke-keys", action="store_true",
                            help="remove: also revoke the user's keys in the team (else a user holding keys stays)")

    def handle(self, *args, action: str, team: str, username: str, **options):
        found = Team.objects.filter(name=team).first()
        if found is None:
            raise CommandError(f"No team named {team!r} (create it with create_team).")
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named {username!r}.")
        if action == "add":
            current = Membership.objects.filter(team=found, user=user).first()
            role = options["role"] or (current.role if current else Membership.MEMBER)
            if current is not None and current.role == role:
                self.stdout.write(f"{username} is already a {role} of team {team!r}; nothing changed.")
                return
            add_member(found, user, role)
            verb = "is now" if current else "added as"
            self.stdout.write(f"{username} {verb} {role} of team {team!r}.")
            return
        try:
            removed = remove_member(found, user, revoke_keys_too=options["revoke_keys"])
        except ValidationError as exc:
            raise CommandError(" ".join(exc.message_dict["user"])) from None
        if removed:
            self.stdout.write(f"Removed {username} from team {team!r}.")
        else:
            self.stdout.write(f"{username} is not a member of team {team!r}; nothing changed.")
