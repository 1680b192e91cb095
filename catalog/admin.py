"""The catalog in Django's admin: thin actions, each one call into a `catalog.services` module."""
from __future__ import annotations

from django import forms
from django.forms import Script
from django.contrib import admin, messages
from django.db import transaction
from django.http import HttpResponseRedirect
from django.shortcuts import render
from django.template.defaultfilters import filesizeformat
from django.utils.html import format_html, format_html_join

import protocol
from protocol.gguf import choose_gguf_file
from protocol.layer_errors import LAYER_ERRORS

from . import selectors
from .services import cached_models, model_control, model_settings
from .models import CachedModel, LoadEvent, ModelLoad, Worker


class IdleTimeoutForm(forms.Form):
    idle_timeout = forms.IntegerField(required=False, min_value=-1,
                                      help_text="seconds; empty: the server default; -1: never unload")


class CatalogRowForm(forms.ModelForm):
    """A changelist row's editable cells, each named for assistive technology after its field and model
    (the column header is far away; axe's `label` rule)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for name, field in self.fields.items():
            field.widget.attrs["aria-label"] = f"{name.replace('_', ' ')} of {self.instance.repo_id}"


def _who(request) -> str:
    return f"admin:{request.user.get_username()}"


def _intermediate(request, queryset, action: str, intro: str, submit_label: str, form=None, show_size=False):
    return render(request, "admin/catalog/action_form.html", {
        "queryset": queryset, "action": action, "intro": intro, "submit_label": submit_label, "form": form,
        "show_size": show_size, "title": intro, "opts": CachedModel._meta})


class WorkersUnreachable:
    """Actions and saves that message the workers, when the channel layer (Redis in scale-out) is down: a
    message on the page and nothing changed (the save or action rolled back), never a 500 page."""

    def response_action(self, request, queryset):
        with transaction.atomic():  # an action's rows change only if its messages reached the layer
            return super().response_action(request, queryset)

    def changelist_view(self, request, extra_context=None):
        return self._unless_layer_down(request, super().changelist_view, extra_context)

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        return self._unless_layer_down(request, super().changeform_view, object_id, form_url, extra_context)

    def _unless_layer_down(self, request, view, *args):
        try:
            return view(request, *args)
        except LAYER_ERRORS as exc:
            self.message_user(request, f"The channel layer (Redis) is unavailable, so the workers could not be told "
                                       f"and nothing was changed ({type(exc).__name__}: {exc}). Try again once it "
                                       "is back.", messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())


class ModelLoadInline(admin.TabularInline):
    model = ModelLoad
    extra = 0
    can_delete = False
    fields = readonly_fields = ("worker", "status", "memory", "loaded_at", "last_used", "error", "degraded",
                                "recent_failures", "last_error")

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="memory (MiB)")
    def memory(self, obj: ModelLoad) -> str:
        return f"{obj.memory_mb:.1f}"

    @admin.display(description="recent failures")
    def recent_failures(self, obj: ModelLoad) -> str:
        return f"{obj.recent_failed} of {obj.recent_jobs}" if obj.recent_jobs else ""


@admin.register(CachedModel)
class CachedModelAdmin(WorkersUnreachable, admin.ModelAdmin):
    list_display = ("repo_id", "status", "loaded_on", "size", "last_used", "parsers", "idle_timeout", "preload",
                    "enabled")
    list_editable = ("idle_timeout", "preload", "enabled")
    list_filter = ("enabled", "preload", "is_causal_lm", "gone", "dtype")
    search_fields = ("repo_id",)
    readonly_fields = ("repo_id", "revision", "revisions", "size_on_disk", "architectures", "is_causal_lm",
                       "modalities", "last_modified", "last_scanned", "gone", "detected_parsers", "parsers", "gguf")
    exclude = ("gguf_files",)  # shown as `gguf` (the served file marked)
    inlines = [ModelLoadInline]
    actions = ["preload_now", "unload_now", "reload_now", "set_idle_timeout", "enable", "disable", "rescan_cache",
               "delete_from_cache"]

    class Media:
        # Preload and Unload from the changelist stream /load_model's stages and bytes into each row
        # (without the script they are the plain actions below). A module: it imports the pages' api.js.
        js = (Script("catalog/admin-catalog.js", type="module"),)
        css = {"all": ("catalog/admin-catalog.css",)}

    def has_add_permission(self, request) -> bool:
        return False  # rows come from cache scans

    def get_changelist_form(self, request, **kwargs):
        return super().get_changelist_form(request, **{"form": CatalogRowForm, **kwargs})

    def changelist_view(self, request, extra_context=None):
        # The table with the filters beside it fits 1280 px only without the admin's left navigation
        # (Home and the breadcrumbs are still there).
        return super().changelist_view(request, {"is_nav_sidebar_enabled": False, **(extra_context or {})})

    @admin.display(description="status")
    def status(self, obj: CachedModel) -> str:
        state = None if obj.gone else selectors.load_state(obj.repo_id)
        status = "gone" if obj.gone else state["status"] if state else "cached"
        # The model's name and size for the script that shows a load's progress in this cell.
        cell = format_html('<span class="model-status" data-model="{}" data-bytes="{}">{}</span>',
                           obj.repo_id, obj.size_on_disk or 0, status)
        health = state and state.get("health")
        if not health:
            return cell
        # Degraded: how many of its recent requests failed, and the last error (whole, on hover).
        error = health["last_error"]
        return format_html('{}<br><span class="model-health" title="{}">{} of {} failed on {}: {}</span>', cell,
                           error, health["failed"], health["of"], ", ".join(health["degraded_on"]),
                           error if len(error) <= 80 else error[:79] + "…")

    @admin.display(description="loaded on")
    def loaded_on(self, obj: CachedModel) -> str:
        state = selectors.load_state(obj.repo_id)
        return ", ".join(state["loaded_on"]) if state else ""

    @admin.display(description="size", ordering="size_on_disk")
    def size(self, obj: CachedModel) -> str:
        return filesizeformat(obj.size_on_disk)

    @admin.display(description="parsers")
    def parsers(self, obj: CachedModel) -> str:
        """What its chat answers are parsed with (tool / reasoning): the override set here, else what its files
        (and the chat template set here) say; which of them, on hover (the column stays narrow)."""
        snapshot = selectors.snapshot_path(obj.repo_id) if obj.chat_template else None
        chosen = selectors.effective_parsers(obj.detected_parsers or {}, obj.tool_parser, obj.reasoning_parser,
                                             obj.chat_template, snapshot)
        if not chosen:
            return ""
        return format_html('<span title="tool / reasoning parser, from: {}">{} / {}</span>', chosen["source"],
                           chosen["tool_parser"], chosen["reasoning_parser"] or "none")

    @admin.display(description="GGUF files")
    def gguf(self, obj: CachedModel) -> str:
        """A GGUF model's files with their quantization types, the one it serves marked."""
        files = [str(pair[0]) for pair in obj.gguf_files or ()]
        if not files:
            return ""
        try:
            serving = choose_gguf_file(files, obj.gguf_file)
        except ValueError:
            serving = ""
        return format_html_join(", ", "{} ({}){}", ((name, quantization, " ← served" if name == serving else "")
                                                     for name, quantization in obj.gguf_files))

    @admin.display(description="last used")
    def last_used(self, obj: CachedModel):
        state = selectors.load_state(obj.repo_id)
        return state["last_used"] if state else None

    def save_model(self, request, obj, form, change) -> None:
        model_settings.save_model_settings(obj)  # list_editable and the change form both land here

    @admin.action(description="Preload now (load on a worker)")
    def preload_now(self, request, queryset) -> None:
        for model in queryset:
            where = model_control.request_load(protocol.ModelRef(model.repo_id), _who(request))
            self.message_user(request, f"Asked {where} to load {model.repo_id}.")

    @admin.action(description="Unload now (from every worker)")
    def unload_now(self, request, queryset) -> None:
        for model in queryset:
            model_control.request_unload(protocol.ModelRef(model.repo_id), _who(request))
        self.message_user(request, f"Asked every worker to unload {queryset.count()} model(s); "
                                   "a worker refuses while the model is generating.")

    @admin.action(description="Reload now (unload, then load again: a degraded model starts afresh)")
    def reload_now(self, request, queryset) -> None:
        for model in queryset:
            where = model_control.request_reload(protocol.ModelRef(model.repo_id), _who(request))
            self.message_user(request, f"Asked {', '.join(where)} to reload {model.repo_id}; "
                                       "a worker refuses while the model is generating.")

    @admin.action(description="Set idle timeout…")
    def set_idle_timeout(self, request, queryset):
        if "apply" in request.POST:
            form = IdleTimeoutForm(request.POST)
            if form.is_valid():
                count = model_settings.set_idle_timeout(list(queryset), form.cleaned_data["idle_timeout"])
                self.message_user(request, f"Idle timeout set on {count} model(s).")
                return None
        else:
            form = IdleTimeoutForm()
        return _intermediate(request, queryset, "set_idle_timeout", "Set the idle timeout of these models",
                             "Set idle timeout", form=form)

    @admin.action(description="Enable")
    def enable(self, request, queryset) -> None:
        self.message_user(request, f"Enabled {model_settings.set_enabled(list(queryset), True)} model(s).")

    @admin.action(description="Disable (clients can no longer use them)")
    def disable(self, request, queryset) -> None:
        self.message_user(request, f"Disabled {model_settings.set_enabled(list(queryset), False)} model(s).")

    @admin.action(description="Rescan the cache")
    def rescan_cache(self, request, queryset) -> None:
        self.message_user(request, f"Cache rescanned: {cached_models.scan_cache()}.")

    @admin.action(description="Delete from cache…")
    def delete_from_cache(self, request, queryset):
        if "apply" in request.POST:
            freed = sum(cached_models.delete_from_cache(model, _who(request)) for model in queryset)
            self.message_user(request, f"Deleted {queryset.count()} model(s) from the cache, "
                                       f"{filesizeformat(freed)} freed.", messages.WARNING)
            return None
        return _intermediate(request, queryset, "delete_from_cache",
                             "Delete these models' files from the Hugging Face cache? Workers unload them first.",
                             "Yes, delete the files", show_size=True)


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = ("name", "live_status", "device", "memory", "loaded_models", "last_heartbeat", "started_at")
    list_filter = ("status",)
    search_fields = ("name", "host")
    readonly_fields = [f.name for f in Worker._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False

    @admin.display(description="status")
    def live_status(self, obj: Worker) -> str:
        return "online" if selectors.worker_is_alive(obj) else ("lost" if obj.status == Worker.Status.ONLINE else obj.status)

    @admin.display(description="memory (MiB used / total)")
    def memory(self, obj: Worker) -> str:
        total = f"{obj.memory_total_mb:.0f}" if obj.memory_total_mb else "?"
        return f"{obj.memory_used_mb:.1f} / {total}"

    @admin.display(description="loaded models")
    def loaded_models(self, obj: Worker) -> str:
        if not selectors.worker_is_alive(obj):
            return ""
        return ", ".join(selectors.models_on_worker(obj))


@admin.register(LoadEvent)
class LoadEventAdmin(admin.ModelAdmin):
    list_display = ("at", "action", "model_name", "worker", "requested_by", "duration", "error")
    list_filter = ("action", "requested_by")
    search_fields = ("model_name", "requested_by")
    fields = readonly_fields = [f.name if f.name != "duration_s" else "duration" for f in LoadEvent._meta.fields]

    @admin.display(description="duration (s)", ordering="duration_s")
    def duration(self, obj: LoadEvent) -> str:
        return "" if obj.duration_s is None else f"{obj.duration_s:.2f}"

    def has_add_permission(self, request) -> bool:
        return False
