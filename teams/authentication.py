"""DRF authentication: every authenticated request carries a Principal as `request.auth`.

Bearer keys are compared by hash and looked up on every request, so revocation and expiry
take effect on the next one. `SessionPrincipalAuthentication` is the same for a signed-in
browser user (no key): counted against the user's team exactly like a key.
"""
from __future__ import annotations

from django.conf import settings
from rest_framework.authentication import BaseAuthentication, SessionAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import BasePermission

from . import selectors, services
from .principal import Principal


class BearerKeyAuthentication(BaseAuthentication):
    """`Authorization: Bearer <key>`; with auth off, every request is the default team's."""

    def authenticate(self, request):
        header = get_authorization_header(request).split()
        if not settings.INFERENCE["AUTH_ENABLED"]:
            return None, Principal.of(services.default_team())
        if not header:
            return None
        if header[0].lower() != b"bearer" or len(header) != 2:
            raise AuthenticationFailed()
        try:
            raw_key = header[1].decode()
        except UnicodeDecodeError:
            raise AuthenticationFailed() from None
        key = selectors.usable_key(raw_key)
        if key is None:
            raise AuthenticationFailed()
        services.touch_key(key)
        return key, selectors.principal_for_key(key)

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="api"'


class SessionPrincipalAuthentication(SessionAuthentication):
    """A signed-in user of a team (CSRF enforced, as DRF's SessionAuthentication); needs the session middleware."""

    def authenticate(self, request):
        found = super().authenticate(request)
        if found is None:
            return None
        principal = selectors.principal_for_user(found[0])
        return (found[0], principal) if principal is not None else None


class HasPrincipal(BasePermission):
    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, Principal)
