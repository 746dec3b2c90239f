"""Bearer-token authentication for agent principals (DRF)."""

from __future__ import annotations

from rest_framework import authentication, exceptions

from console.models import AgentPrincipal, hash_token


def principal_for_authorization(header: str) -> AgentPrincipal | None:
    """The active agent principal named by an `Authorization: Bearer <token>` header, or None."""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return (
        AgentPrincipal.objects.select_related("tenant")
        .filter(token_hash=hash_token(token.strip()), is_active=True)
        .first()
    )


class AgentTokenAuthentication(authentication.BaseAuthentication):
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
