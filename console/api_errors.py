"""One error shape for the whole API: {"error": {"code", "message", "details"}}."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response

from console.lib.errors import DomainError, RateLimited

_DRF_CODES = {
    status.HTTP_400_BAD_REQUEST: "invalid",
    status.HTTP_401_UNAUTHORIZED: "unauthenticated",
    status.HTTP_403_FORBIDDEN: "forbidden",
    status.HTTP_404_NOT_FOUND: "not_found",
    status.HTTP_405_METHOD_NOT_ALLOWED: "method_not_allowed",
    status.HTTP_406_NOT_ACCEPTABLE: "not_acceptable",
    status.HTTP_415_UNSUPPORTED_MEDIA_TYPE: "unsupported_media_type",
    status.HTTP_429_TOO_MANY_REQUESTS: "rate_limited",
}


def error_response(code: str, message: str, details=None, *, status_code: int, headers=None) -> Response:
    return Response(
        {"error": {"code": code, "message": message, "details": details or {}}},
        status=status_code, headers=headers,
    )


def exception_handler(exc, context):
    if isinstance(exc, DomainError):
        headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, RateLimited) else None
        return error_response(exc.code, exc.message, exc.details, status_code=exc.status, headers=headers)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    if isinstance(exc, exceptions.APIException):
        headers = {}
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = exc.auth_header
        if getattr(exc, "wait", None):
            headers["Retry-After"] = str(int(exc.wait))
        if isinstance(exc.detail, dict | list):
            message, details = "The request is invalid.", {"fields": exc.detail}
        else:
            message, details = str(exc.detail), {}
        code = _DRF_CODES.get(exc.status_code, "error")
        return error_response(code, message, details, status_code=exc.status_code, headers=headers or None)
    return None
