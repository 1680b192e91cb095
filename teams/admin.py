"""Teams, members, keys and usage in Django's admin; every change goes through `teams.services`.

A new key's secret is rendered once, in the response to the form that created it, and never
stored: the row keeps only its hash and visible prefix.
"""
from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone

from . import services
from .models import APIKey, Membership, Team, UsageRecord
from .usage_report import usage_report_view


class MembershipFormSet(forms.BaseInlineFormSet):
    def clean(self):
        """A key belongs to a member of its team: like `team_member remove`, keep a member holding keys."""
        super().clean()
        for form in self.deleted_forms:
            membership = form.instance
            if membership.pk is None:
                continue
            keys = services.member_keys(membership.team, membership.user)
            if keys.exists():
                names = ", ".join(f"{key.name} ({key.prefix}…)" for key in keys)
                raise ValidationError(f"{membership.user} holds keys in this team: {names}. Revoke them first.")


class MembershipInline(admin.TabularInline):
    model = Membership
    formset = MembershipFormSet
    extra = 1
    autocomplete_fields = ("user",)


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("name", "model_list", "rpm", "tpm", "max_parallel", "token_budget", "budget_period_days",
                    "share", "member_count", "key_count")
    search_fields = ("name",)
    inlines = [MembershipInline]

    @admin.display(description="models")
    def model_list(self, team: Team) -> str:
        return ", ".join(team.allowed_models) or "all"

    @admin.display(description="members")
    def member_count(self, team: Team) -> int:
        return team.memberships.count()

    @admin.display(description="keys")
    def key_count(self, team: Team) -> int:
        return team.keys.filter(revoked_at__isnull=True).count()


class APIKeyForm(forms.ModelForm):
    class Meta:
        model = APIKey
        fields = ("name", "team", "user", "allowed_models", "rpm", "tpm", "max_parallel", "expires_at", "manage_models",
                  "service_tier")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["service_tier"].required = False  # left out: interactive

    def clean(self):
        data = super().clean()
        data["service_tier"] = data.get("service_tier") or APIKey.INTERACTIVE
        team = data.get("team")
        if team is not None:
            try:
                services.check_narrows(team, data.get("allowed_models") or [],
                                       {f: data.get(f) for f in services.LIMIT_FIELDS})
                services.check_member(team, data.get("user"))
            except ValidationError as exc:
                for field, errors in exc.message_dict.items():
                    self.add_error(field, errors)
        return data


@admin.register(APIKey)
class APIKeyAdmin(admin.ModelAdmin):
    form = APIKeyForm
    list_display = ("name", "team", "user", "prefix", "service_tier", "created_at", "last_used_at", "expires_at",
                    "status")
    list_filter = ("team", "service_tier", ("revoked_at", admin.EmptyFieldListFilter))
    search_fields = ("name", "prefix", "team__name", "user__username")
    readonly_fields = ("prefix", "created_at", "last_used_at", "revoked_at")
    actions = ["revoke"]

    @admin.display(description="status")
    def status(self, key: APIKey) -> str:
        if key.revoked_at:
            return "revoked"
        if key.expires_at and key.expires_at <= timezone.now():
            return "expired"
        return "active"

    @admin.action(description="Revoke selected keys (they fail from their next request)")
    def revoke(self, request, queryset) -> None:
        count = services.revoke_keys(queryset)
        self.message_user(request, f"Revoked {count} key(s).", messages.SUCCESS)

    def save_model(self, request, obj: APIKey, form, change: bool) -> None:
        if not change:
            obj.raw_secret, obj.prefix, obj.hashed_key = services.new_secret()  # never saved
        super().save_model(request, obj, form, change)

    def response_add(self, request, obj: APIKey, post_url_continue=None):
        """The page after saving a new key shows its secret, this once."""
        return TemplateResponse(request, "admin/teams/apikey/secret.html", {
            **self.admin_site.each_context(request), "key": obj, "secret": obj.raw_secret,
            "opts": self.model._meta, "title": f"API key {obj.name!r} created"})


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = ("created_at", "team", "key", "user", "model", "endpoint", "prompt_tokens", "completion_tokens",
                    "time_to_first_token_ms", "duration_ms", "status_code", "refused", "finish_reason", "cancelled", "error_code")
    list_filter = ("team", "model", "endpoint", "status_code", "refused", "cancelled")
    search_fields = ("request_id", "key__prefix", "key__name")
    date_hierarchy = "created_at"
    change_list_template = "admin/teams/usagerecord/change_list.html"

    def get_urls(self):
        report = self.admin_site.admin_view(usage_report_view)
        return [path("report/", report, name="teams_usage_report"), *super().get_urls()]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
