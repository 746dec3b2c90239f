"""The agent API's toolkit: what every endpoint of `/api/v1/` and `/v1/traces` shares.

- The error shape, `{"error": {"code", "message", "details"}}`, rendered by one function,
  `error_body`. The DRF views get it through `exception_handler` (REST_FRAMEWORK's
  EXCEPTION_HANDLER); the plain Django views (the async long-poll, OTLP ingest) call
  `error_body` and wrap it in their own response class. A database error is 503 `unavailable`
  in either (`database_unavailable`): DRF's through `exception_handler`, the plain views'
  through `DatabaseUnavailableMiddleware`.
- Bearer-token authentication of agent principals: `principal_for_authorization` for any
  view, `AgentTokenAuthentication` for DRF, and its OpenAPI security scheme.
- Strict serializer fields (a JSON string is not a number and the reverse), the error
  serializer and `errors(...)`, which documents a view's error responses.

This module is the floor the apps' API modules stand on, so it imports no app (`runs`,
`approvals`, `ledger`); they import it.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import OperationalError
from django.http import Http404, HttpRequest, JsonResponse
from django.utils.deprecation import MiddlewareMixin
from drf_spectacular.extensions import (
    OpenApiAuthenticationExtension,
    OpenApiSerializerFieldExtension,
)
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema_field
from rest_framework import authentication, exceptions, parsers, serializers, status
from rest_framework.response import Response

from console import queries
from console.lib import jsonlimits, sql
from console.lib.canonical import canonical_json
from console.lib.errors import DomainError, RateLimited
from console.models import AgentPrincipal, Tenant, hash_token

# --- the error shape -------------------------------------------------------------------------

logger = logging.getLogger(__name__)

# The code a DRF exception answers with, by its status.
DRF_CODES = {
    status.HTTP_400_BAD_REQUEST: "invalid",
    status.HTTP_401_UNAUTHORIZED: "unauthenticated",
    status.HTTP_403_FORBIDDEN: "forbidden",
    status.HTTP_404_NOT_FOUND: "not_found",
    status.HTTP_405_METHOD_NOT_ALLOWED: "method_not_allowed",
    status.HTTP_406_NOT_ACCEPTABLE: "not_acceptable",
    status.HTTP_415_UNSUPPORTED_MEDIA_TYPE: "unsupported_media_type",
    status.HTTP_429_TOO_MANY_REQUESTS: "rate_limited",
}


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """The body of every API error: `details` is always an object, empty when there are none."""
    return {"error": {"code": code, "message": message, "details": details or {}}}


def database_unavailable(exc: OperationalError, message: str) -> tuple[dict[str, Any], int, dict[str, str]]:
    """The answer to a database error, as (body, status, headers): 503 `unavailable` with
    Retry-After, logged. The database went away, a deadlock, a lock that timed out: the statement
    failed, and the same request may simply be sent again."""
    logger.warning("API request failed on the database; answered 503", exc_info=exc)
    return error_body("unavailable", message), status.HTTP_503_SERVICE_UNAVAILABLE, {"Retry-After": "1"}


# Machine clients (the agent API, OTLP exporters) get the API's error shape, people the pages.
API_PREFIXES = ("/api/", "/v1/")


def for_machines(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIXES)


class DatabaseUnavailableMiddleware(MiddlewareMixin):
    """A database error in a plain Django view under the API's paths (the long-poll, the
    proposal that waits, OTLP ingest) is the 503 a DRF view answers, not a 500. DRF's views
    never let one reach it (`exception_handler`); the pages for people are left alone."""

    def process_exception(self, request: HttpRequest, exception: Exception) -> JsonResponse | None:
        if not isinstance(exception, OperationalError) or not for_machines(request):
            return None
        # The view may have committed before it failed (a proposal that waited): the same request
        # sent again is then answered from the ledger, so "nothing was written" is not said here.
        body, status_code, headers = database_unavailable(exception, "The database is unavailable. Try again.")
        return JsonResponse(body, status=status_code, headers=headers)


def exception_handler(exc, context) -> Response | None:
    """DRF's EXCEPTION_HANDLER: domain errors answer with their own code and status (a
    rate limit with Retry-After); DRF's own errors with the code for their status, validation
    errors under `details.fields`, and their WWW-Authenticate / Retry-After headers. Anything
    else is not an API error and is left to propagate (None)."""
    if isinstance(exc, DomainError):
        headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, RateLimited) else None
        return Response(error_body(exc.code, exc.message, exc.details), status=exc.status, headers=headers)
    if isinstance(exc, OperationalError):
        # The transaction rolled back: nothing was written.
        body, status_code, headers = database_unavailable(
            exc, "The database is unavailable; nothing was written. Try again.")
        return Response(body, status=status_code, headers=headers)
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
        code = DRF_CODES.get(exc.status_code, "error")
        return Response(error_body(code, message, details), status=exc.status_code, headers=headers or None)
    return None


# --- bearer tokens ---------------------------------------------------------------------------


def principal_for_authorization(header: str) -> AgentPrincipal | None:
    """The active agent principal named by an `Authorization: Bearer <token>` header, or None."""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    # Written by hand (console.queries): the ORM would compile this query anew on every request.
    connection = sql.connection_for(AgentPrincipal)
    row = sql.fetchone(connection, queries.PRINCIPAL_SQL, [hash_token(token.strip())])
    if row is None:
        return None
    principal = sql.load(AgentPrincipal, row, connection=connection)
    sql.attach(principal, "tenant", sql.load(Tenant, row, sql.width(AgentPrincipal), connection=connection))
    return principal


class AgentTokenAuthentication(authentication.BaseAuthentication):
    """DRF authentication by an agent's bearer token; `request.user` is the AgentPrincipal.
    No header means anonymous (the permission class answers 401); a malformed or unknown
    token is refused outright."""

    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != self.keyword.lower() or not token.strip():
            raise exceptions.AuthenticationFailed("Use 'Authorization: Bearer <token>'.")
        principal = principal_for_authorization(header)
        if principal is None:
            raise exceptions.AuthenticationFailed("Unknown or inactive agent token.")
        return principal, token

    def authenticate_header(self, request) -> str:
        return self.keyword


class AgentTokenScheme(OpenApiAuthenticationExtension):
    """Documents AgentTokenAuthentication as the `agentToken` bearer security scheme."""

    target_class = AgentTokenAuthentication
    name = "agentToken"

    def get_security_definition(self, auto_schema):
        return build_bearer_security_scheme_object(header_name="Authorization", token_prefix="Bearer")


# --- fields and schema pieces ----------------------------------------------------------------


class StrictCharField(serializers.CharField):
    """A JSON string, not anything DRF could turn into one (5 is not a goal)."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictCharFieldExtension(OpenApiSerializerFieldExtension):
    """A StrictCharField that trims and may not be blank refuses a string of spaces: the schema
    says so with a pattern (a character that is not white space as `str.strip` counts it)."""

    target_class = StrictCharField
    match_subclasses = True

    def map_serializer_field(self, auto_schema, direction):
        schema = auto_schema._map_serializer_field(self.target, direction, bypass_extensions=True)
        if self.target.trim_whitespace and not self.target.allow_blank:
            schema.setdefault("pattern", r"[^\s\x1c-\x1f\x85]")
        return schema


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer: "3", 3.0 and true are not versions or tokens."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


def canonicalizable(value: Any) -> None:
    """A value RFC 8785 can write (hashes are taken over it): no integer beyond 2^53, no NaN."""
    try:
        canonical_json(value)
    except (ValueError, TypeError) as exc:  # rfc8785.CanonicalizationError is a ValueError
        raise serializers.ValidationError(f"Canonical JSON (RFC 8785) cannot hold this value: {exc}") from exc


@extend_schema_field(OpenApiTypes.OBJECT)
class JSONObjectField(serializers.JSONField):
    """A JSON object; a list, string or number in its place is refused."""

    default_error_messages = {"not_object": "Expected a JSON object."}

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            self.fail("not_object")
        return super().to_internal_value(data)


# The error shape, for the schema (`error_body` renders it). No docstring: drf-spectacular
# would publish it as the component's description.
class ErrorSerializer(serializers.Serializer):
    class Body(serializers.Serializer):
        code = serializers.CharField(help_text="invalid, unauthenticated, forbidden, not_found, conflict, "
                                               "illegal_transition, intent_mismatch, rate_limited, unavailable, …")
        message = serializers.CharField()
        details = serializers.DictField(help_text="Machine-readable; validation errors are under `fields`.")

        class Meta:
            ref_name = "ErrorBody"

    error = Body()

    class Meta:
        ref_name = "Error"


ERROR_DESCRIPTIONS = {
    400: "Invalid input (malformed JSON, wrong types, schema).",
    401: "Missing or unknown bearer token.",
    403: "Not permitted.",
    404: "No such record in your tenant.",
    409: "Version or fencing token conflict, or in flight.",
    422: "Same key, other intent.",
    503: "The database failed mid-request: send the same request again after Retry-After.",
}


def errors(*codes: int) -> dict[int, OpenApiResponse]:
    """The error responses of a view, for `extend_schema(responses={..., **errors(400, 401)})`;
    and always 503, which any view that reads the database may answer."""
    return {code: OpenApiResponse(ErrorSerializer, description=ERROR_DESCRIPTIONS[code]) for code in (*codes, 503)}


class JSONParser(parsers.JSONParser):
    """The API's only body parser: JSON with a nesting budget checked before anything recursive
    reads it (`console.lib.jsonlimits`). A body over it is a 400 like any malformed body."""

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            return jsonlimits.loads(stream.read().decode(encoding))
        except jsonlimits.TooDeep as exc:
            raise exceptions.ParseError(str(exc)) from exc
        except ValueError as exc:
            raise exceptions.ParseError(f"JSON parse error - {exc}") from exc
