"""Every error leaves the server in OpenAI's shape, built here and nowhere else.

`{"error": {"message", "type", "param", "code"}}` with the matching status.
"""
from __future__ import annotations

import logging

from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import JsonResponse
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response

from catalog.errors import CatalogError
from teams.errors import ModelNotAllowed
from teams.metering import LimitExceeded
from protocol.burst_log import BurstLog
from protocol.layer_errors import LAYER_ERRORS

logger = logging.getLogger(__name__)
# A 503 is the server saying it cannot serve now (full, a service down, a worker lost): expected under
# overload or an outage, logged once per burst and kind at WARNING, not an ERROR line per request.
unavailability = BurstLog(logger)

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}


def in_request_terms(error: "APIError", names: dict[str, str]) -> "APIError":
    """A worker's error about a job's `prompt` or `max_tokens`, with the fields as this endpoint names them
    (`param`, and the backticked names in the message)."""
    if not names or error.param not in names and not any(f"`{name}`" in error.message for name in names):
        return error
    for name, field in names.items():
        error.message = error.message.replace(f"`{name}`", f"`{field}`")
    error.param = names.get(error.param, error.param)
    return error


class APIError(Exception):
    """An error a client caused or should know about; carries its HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        error_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.error_type = error_type


def catalog_error(exc: CatalogError) -> APIError:
    """A model the catalog cannot serve (unknown, or disabled) is a 404 to the client."""
    return model_not_found(exc.message)


def model_not_found(message: str) -> APIError:
    return APIError(404, message, param="model", code="model_not_found")


# Seconds a client is told to wait when a backing service (database, Redis) is down.
SERVICE_RETRY_AFTER = 5


def unavailable(exc: BaseException) -> APIError | None:
    """A database or channel-layer outage as a 503 with Retry-After (None for any other error).

    Outages are the operator's problem, not the client's, and they pass: never a 500.
    """
    if isinstance(exc, (OperationalError, InterfaceError)):
        what, code = "The database is unavailable", "database_unavailable"
    elif isinstance(exc, LAYER_ERRORS):
        what, code = "The channel layer (Redis) is unavailable", "channel_layer_unavailable"
    else:
        return None
    unavailability.note(code, "%s: %s", what, exc)
    return APIError(503, f"{what}; retry shortly.", None, code, {"Retry-After": str(SERVICE_RETRY_AFTER)})


def error_body(status: int, message: str, param: str | None = None, code: str | None = None,
               error_type: str | None = None) -> dict:
    return {
        "error": {
            "message": message,
            "type": error_type or ERROR_TYPES.get(status, "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }


def team_error(exc: Exception) -> APIError | None:
    """A team's refusal as the API answers it: a limit is a 429 with OpenAI's type ("requests"/"tokens")
    and Retry-After; a model the caller may not use is the 404 of an unknown model."""
    if isinstance(exc, ModelNotAllowed):
        return model_not_found(exc.message)
    if isinstance(exc, LimitExceeded):
        return APIError(429, exc.message, None, exc.code,
                        {**getattr(exc, "headers", {}), "Retry-After": str(exc.retry_after)}, exc.kind)
    return None


def client_error(exc: BaseException) -> APIError:
    """The error a client is answered for `exc` on the generation path (what its ledger row records): the
    APIError itself, a team's refusal, an unknown model, an outage's 503, else a 500."""
    if isinstance(exc, APIError):
        return exc
    found = team_error(exc) if isinstance(exc, Exception) else None
    if found is None and isinstance(exc, CatalogError):
        found = catalog_error(exc)
    return found or unavailable(exc) or APIError(500, "The server had an error processing your request.",
                                                  code="internal_error")


def _first_validation_error(detail, path: str = "") -> tuple[str | None, str]:
    """Walk DRF's nested error detail to the first message and its dotted field path."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            sub = key if key != "non_field_errors" else ""
            param, message = _first_validation_error(value, f"{path}.{sub}" if path and sub else (sub or path))
            return param, message
    if isinstance(detail, list) and detail:
        if all(not isinstance(item, (dict, list)) for item in detail):
            return path or None, str(detail[0])
        for index, item in enumerate(detail):
            if item:
                return _first_validation_error(item, f"{path}[{index}]")
    return path or None, str(detail)


def _content_type(context: dict) -> str:
    request = context.get("request")
    return (request.META.get("CONTENT_TYPE") or "").lower() if request is not None else ""


def exception_handler(exc: Exception, context: dict) -> Response:
    """DRF's EXCEPTION_HANDLER: map every exception to an OpenAI error body."""
    exc = team_error(exc) or exc
    if isinstance(exc, CatalogError):
        exc = catalog_error(exc)
    exc = unavailable(exc) or exc
    if isinstance(exc, APIError):
        response = Response(error_body(exc.status, exc.message, exc.param, exc.code, exc.error_type),
                            status=exc.status, headers=exc.headers)
        if exc.status == 503:
            unavailability.note(exc.code or "503", "answering 503 %s: %s", exc.code, exc.message)
            response._has_been_logged = True  # Django's own ERROR line per 5xx (django.utils.log.log_response)
        return response
    if isinstance(exc, RequestDataTooBig):
        return Response(error_body(413, "Request body too large.", None, "request_too_large"), status=413)
    if isinstance(exc, drf_exceptions.ValidationError):
        param, message = _first_validation_error(exc.detail)
        if param and not message.startswith(param):
            message = f"{param}: {message}"
        return Response(error_body(400, message, param, "invalid_value"), status=400)
    if isinstance(exc, drf_exceptions.ParseError):
        if _content_type(context).startswith("multipart/"):
            message = "We could not parse the multipart form body of your request. " + str(exc.detail)
            return Response(error_body(400, message, None, "invalid_multipart"), status=400)
        message = "We could not parse the JSON body of your request. " + str(exc.detail)
        return Response(error_body(400, message, None, "invalid_json"), status=400)
    if isinstance(exc, drf_exceptions.UnsupportedMediaType):
        return Response(error_body(400, str(exc.detail), None, "unsupported_media_type"), status=400)
    if isinstance(exc, (drf_exceptions.NotAuthenticated, drf_exceptions.AuthenticationFailed)):
        message = (
            "Incorrect API key provided."
            if isinstance(exc, drf_exceptions.AuthenticationFailed)
            else "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'."
        )
        return Response(
            error_body(401, message, None, "invalid_api_key"),
            status=401,
            headers={"WWW-Authenticate": 'Bearer realm="api"'},
        )
    if isinstance(exc, drf_exceptions.APIException):
        status = exc.status_code
        headers = {}
        if isinstance(exc, drf_exceptions.Throttled) and exc.wait is not None:
            headers["Retry-After"] = str(int(exc.wait) + 1)
        return Response(error_body(status, str(exc.detail), None, getattr(exc, "default_code", None)), status=status, headers=headers)
    logger.exception("unhandled error in API view", exc_info=exc)
    return Response(error_body(500, "The server had an error processing your request.", None, "internal_error"), status=500)


def bad_request_view(request, exception=None) -> JsonResponse:
    """Django's own 400s (a Host outside ALLOWED_HOSTS on the admin, a bad multipart body)."""
    return JsonResponse(error_body(400, "Bad request.", None, "bad_request"), status=400)


def forbidden_view(request, exception=None) -> JsonResponse:
    return JsonResponse(error_body(403, "Forbidden.", None, "forbidden"), status=403)


def not_found_view(request, exception=None) -> JsonResponse:
    return JsonResponse(error_body(404, f"Unknown path: {request.path}", None, "unknown_url"), status=404)


def server_error_view(request) -> JsonResponse:
    return JsonResponse(error_body(500, "The server had an error processing your request.", None, "internal_error"), status=500)
