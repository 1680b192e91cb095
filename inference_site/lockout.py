"""What a locked-out login sees (django-axes' AXES_LOCKOUT_CALLABLE): a 429 that says why and until when.

The admin's and the pages' login forms are HTML, so is this answer; a JSON client gets OpenAI's shape.
"""
from __future__ import annotations

from django.conf import settings
from django.http import HttpResponse, JsonResponse


def locked_out(request, credentials=None, *args, **kwargs) -> HttpResponse:
    minutes = settings.AXES_COOLOFF_TIME.total_seconds() / 60
    message = (f"Too many failed logins for this username or from this address: logging in is locked for "
               f"{minutes:g} minutes. An administrator can lift the lockout sooner.")
    retry = {"Retry-After": str(int(settings.AXES_COOLOFF_TIME.total_seconds()))}
    if "application/json" in request.headers.get("Accept", ""):
        from openai_api.errors import error_body

        return JsonResponse(error_body(429, message, None, "login_locked_out"), status=429, headers=retry)
    return HttpResponse(f"<!doctype html><title>Login locked</title><h1>Login locked</h1><p>{message}</p>",
                        status=429, headers=retry)
