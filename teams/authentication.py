"""DRF authentication: every authenticated request carries a Principal as `request.auth`.

Bearer keys are compared by hash and looked up on every request, so revocation and expiry
take effect on the next one. `SessionPrincipalAuthentication` is the same for a signed-in
browser user (no key): counted against the user's team exactly like a key.
"""
from __future__ import annotations

from importlib import import_module

from django.conf import settings
from django.contrib.auth import get_user
from rest_framework.authentication import BaseAuthentication, SessionAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed, PermissionDenied, Throttled
from rest_framework.permissions import BasePermission

from catalog.config import web_config

from . import bad_keys, selectors, services
from .principal import Principal


class BearerKeyAuthentication(BaseAuthentication):
    """`Authorization: Bearer <key>`; with auth off, every request is the default team's."""

    def authenticate(self, request):
        header = get_authorization_header(request).split()
        if not web_config().auth_enabled:
            return None, Principal.of(services.default_team())
        if not header:
            return None
        config, address = web_config(), request.META.get("REMOTE_ADDR") or "?"
        wait = bad_keys.refused_for(address, config.bad_key_limit, config.bad_key_window)
        if wait is not None:
            raise Throttled(wait, "Too many requests with a wrong API key from this address; try again later.")
        key = None
        if header[0].lower() == b"bearer" and len(header) == 2:
            try:
                key = selectors.usable_key(header[1].decode())
            except UnicodeDecodeError:
                key = None
        if key is None:
            bad_keys.failed(address, config.bad_key_window)
            raise AuthenticationFailed()
        services.touch_key(key)
        return key, selectors.principal_for_key(key)

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="api"'


class SessionPrincipalAuthentication(SessionAuthentication):
    """A signed-in user of a team, from our own pages: CSRF enforced, as DRF's SessionAuthentication.

    The API's handler runs without the session and auth middleware (see asgi.py), so the
    session is read here from its cookie, only for requests that carry one.
    """

    def authenticate(self, request):
        django_request = request._request
        user = getattr(django_request, "user", None)
        if user is None:
            session_key = django_request.COOKIES.get(settings.SESSION_COOKIE_NAME)
            if not session_key:
                return None
            django_request.session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
            user = get_user(django_request)
        if not user or not user.is_active or not user.is_authenticated:
            return None
        self.enforce_csrf(request)
        principal = selectors.principal_for_user(user)
        if principal is None:
            raise PermissionDenied("Your account is in no team yet: ask an administrator to add you to one.")
        return user, principal


class HasPrincipal(BasePermission):
    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, Principal)
