"""The browser pages: server-rendered shells whose scripts call the public API with the session cookie.

Every page is framed by nobody (X-Frame-Options and CSP `frame-ancestors`) and runs no inline
script: its CSP allows only our own files.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import cache, wraps

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.staticfiles import finders
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.csrf import ensure_csrf_cookie

from teams.selectors import team_for_user

from .services import join_default_team_if_staff

PAGE_CSP = "; ".join([
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "media-src 'self' data:",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
])


def page_security(view: Callable) -> Callable:
    """Our pages' CSP and anti-framing headers (kept if a middleware set stricter ones already)."""

    @wraps(view)
    def wrapped(request, *args, **kwargs):
        response = view(request, *args, **kwargs)
        response.headers.setdefault("Content-Security-Policy", PAGE_CSP)
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        return response

    return wrapped


def app_page(template: str, active: str) -> Callable:
    """A logged-in page: the template, with the CSRF cookie set for the page's API calls."""

    @page_security
    @login_required
    @ensure_csrf_cookie
    def view(request):
        join_default_team_if_staff(request.user)
        return render(request, template, {"active": active, "default_model": settings.INFERENCE.models.default,
                                          "has_team": team_for_user(request.user) is not None,
                                          # /load_model is an operator's act (docs/reliability.md); for
                                          # everyone else the first request loads the model
                                          "manages_models": request.user.is_staff or request.user.is_superuser})

    return view


chat = app_page("webui/chat.html", "chat")
playground = app_page("webui/playground.html", "playground")
account = app_page("webui/account.html", "account")

login = page_security(auth_views.LoginView.as_view(template_name="webui/login.html", redirect_authenticated_user=True))
logout = page_security(auth_views.LogoutView.as_view())


@page_security
def home(request):
    return redirect("/chat")


@cache
def _favicon() -> bytes:
    with open(finders.find("webui/favicon.ico"), "rb") as icon:
        return icon.read()


def favicon(request):
    """`/favicon.ico`: browsers ask for it on every page (the admin's and the API docs' too), not only ours."""
    response = HttpResponse(_favicon(), content_type="image/x-icon")
    response["Cache-Control"] = "public, max-age=86400"
    return response
