"""Bearer-key authentication as DRF classes, named in settings."""
from __future__ import annotations

from django.conf import settings
from django.utils import timezone
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import BasePermission

from .models import APIKey, hash_key


class BearerKeyAuthentication(BaseAuthentication):
    """`Authorization: Bearer <key>` against hashed APIKey rows."""

    def authenticate(self, request):
        header = get_authorization_header(request).split()
        if not header:
            return None
        if header[0].lower() != b"bearer" or len(header) != 2:
            raise AuthenticationFailed()
        if not settings.INFERENCE["AUTH_ENABLED"]:
            return None
        try:
            raw_key = header[1].decode()
        except UnicodeDecodeError:
            raise AuthenticationFailed() from None
        key = APIKey.objects.filter(hashed_key=hash_key(raw_key), revoked=False).first()
        if key is None:
            raise AuthenticationFailed()
        APIKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now())
        return key, raw_key

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="api"'


class HasAPIKeyOrAuthDisabled(BasePermission):
    def has_permission(self, request, view) -> bool:
        if not settings.INFERENCE["AUTH_ENABLED"]:
            return True
        return isinstance(request.user, APIKey)
