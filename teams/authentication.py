"""DRF authentication: every authenticated request carries a Principal as `request.auth`.

Bearer keys are compared by hash and looked up on every request, so revocation and expiry
take effect on the next one. `SessionPrincipalAuthentication` is the same for a signed-in
browser user (no key): counted against the user's team exactly like a key.

The lookup itself runs on a long-lived thread with a database connection it keeps
(`LookupOnLongLivedThread`): adrf runs a view's `initial` in a thread of the request's own, whose
new database connection cost more than the rest of the request's admission (a burst of 64
completions: ~1 ms of 6 a request). Only a key whose last use is due to be recorded, and a
browser session, still take that thread.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from importlib import import_module
from inspect import iscoroutinefunction

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user
from django.db import InterfaceError, OperationalError, connection
from rest_framework.authentication import BaseAuthentication, SessionAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed, PermissionDenied, Throttled
from rest_framework.permissions import BasePermission

from . import bad_keys, selectors, services
from .client_address import address_bucket, request_client_address
from .principal import Principal


NOT_LOOKED_UP = object()


class BearerKeyAuthentication(BaseAuthentication):
    """`Authorization: Bearer <key>`; with auth off, every request is the default team's.

    A valid key is served whatever its address did; wrong keys are throttled on their own (bad_keys)."""

    def authenticate(self, request):
        header = get_authorization_header(request).split()
        looked_up = getattr(request._request, "looked_up", NOT_LOOKED_UP)  # by LookupOnLongLivedThread
        if not settings.INFERENCE.teams.auth_enabled:
            team = looked_up if looked_up is not NOT_LOOKED_UP else services.default_team()
            return None, Principal.of(team)
        if not header:
            return None
        key = looked_up if looked_up is not NOT_LOOKED_UP else _key_of(header)
        if key is None:
            config, sources = settings.INFERENCE.teams, _wrong_key_sources(request, header)
            wait = bad_keys.refused_for(sources, config.bad_key_limit, config.bad_key_window)
            bad_keys.failed(sources, config.bad_key_window)
            if wait is not None:
                raise Throttled(wait, "Too many requests with a wrong API key from this address (or for this "
                                      "key prefix); try again later.")
            raise AuthenticationFailed()
        bad_keys.was_valid(header[1])
        if not getattr(request._request, "auth_on_loop", False):  # on the loop its use was not due
            services.touch_key(key)
        return key, selectors.principal_for_key(key)

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="api"'


def _wrong_key_sources(request, header: list[bytes]) -> tuple[str, str]:
    address = address_bucket(request_client_address(request._request))
    return bad_keys.sources(address, header[-1])


def _key_of(header: list[bytes]):
    """The usable key an Authorization header's words name, or None."""
    if header[0].lower() != b"bearer" or len(header) != 2:
        return None
    try:
        return selectors.usable_key(header[1].decode())
    except UnicodeDecodeError:
        return None


_lookups = ThreadPoolExecutor(max_workers=2, thread_name_prefix="key-lookup")
# Lookups for a source whose wrong keys are throttled: a flood of them queues here, behind nobody else.
_suspect_lookups = ThreadPoolExecutor(max_workers=1, thread_name_prefix="key-lookup-throttled")


def _on_kept_connection(lookup, *args):
    """`lookup` on this long-lived thread's own connection; once more on a new one when the database
    dropped it (a restart), so the first request after an outage is served."""
    try:
        return lookup(*args)
    except (InterfaceError, OperationalError):
        if connection.connection is not None and connection.is_usable():
            raise  # the database answered (a lock timeout, an outage's refusal): no second wait
        connection.close()
        return lookup(*args)


def _lane(request, header: list[bytes]) -> ThreadPoolExecutor:
    """The throttled sources' own lane, unless the key was valid lately."""
    config = settings.INFERENCE.teams
    if not bad_keys.any_failed() or bad_keys.recently_valid(header[-1]) or bad_keys.refused_for(
            _wrong_key_sources(request, header), config.bad_key_limit, config.bad_key_window) is None:
        return _lookups
    return _suspect_lookups


async def look_up_before_initial(request) -> bool:
    """The request's key (or the default team, auth off) looked up on a long-lived thread and kept on the
    request for `BearerKeyAuthentication`; whether `initial` may now run on the event loop (it reads the
    database no more). False: a browser session, no key, or a key whose use is due to be recorded."""
    django_request = request._request
    if not settings.INFERENCE.teams.auth_enabled:
        lookup, args, lane = services.default_team, (), _lookups
    else:
        header = get_authorization_header(request).split()
        if not header:
            return False
        lookup, args, lane = _key_of, (header,), _lane(request, header)
    found = await asyncio.get_running_loop().run_in_executor(lane, _on_kept_connection, lookup, *args)
    django_request.looked_up = found
    django_request.auth_on_loop = not (settings.INFERENCE.teams.auth_enabled and found is not None and services.touch_due(found))
    return django_request.auth_on_loop


class LookupOnLongLivedThread:
    """adrf's async dispatch, with `initial` on the event loop once `look_up_before_initial` did its
    database work (else in a thread of the request's own, as adrf does). A view whose own `initial`
    does more than check the request sets `initial_on_loop = False`."""

    initial_on_loop = True

    async def async_dispatch(self, request, *args, **kwargs):
        self.args, self.kwargs = args, kwargs
        request = self.initialize_request(request, *args, **kwargs)
        self.request = request
        self.headers = self.default_response_headers
        try:
            if self.initial_on_loop and await look_up_before_initial(request):
                self.initial(request, *args, **kwargs)
            else:
                await sync_to_async(self.initial)(request, *args, **kwargs)
            method = request.method.lower()
            handler = getattr(self, method, self.http_method_not_allowed) if method in self.http_method_names \
                else self.http_method_not_allowed
            if iscoroutinefunction(handler):
                response = await handler(request, *args, **kwargs)
            else:
                response = await sync_to_async(handler)(request, *args, **kwargs)
        except Exception as exc:
            response = self.handle_exception(exc)
        self.response = self.finalize_response(request, response, *args, **kwargs)
        return self.response


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
