"""Request limits per agent token and per tenant (agent API and OTLP), docs/security.md.

A fixed one-minute window per token and per tenant, counted with the cache's atomic increment
in the "ratelimit" cache, which every server process shares: Redis in distributed mode, the
memory of embedded mode's one server process (files under var/ in production without Redis). Over a limit is `RateLimited` (429 in the error
shape, `Retry-After` in the header and in `details`); a limit of 0 is none. Administrators may
give a tenant or a token its own limit in the admin (`api_rate_per_minute`).
"""

from __future__ import annotations

import functools
import time

from django.conf import settings
from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache
from rest_framework.throttling import BaseThrottle

from console.lib.errors import RateLimited
from console.models import AgentPrincipal

WINDOW_SECONDS = 60


def _count(key: str) -> int:
    """One more request in this window: one round trip once the window's key exists."""
    cache = caches["ratelimit"]
    try:
        return cache.incr(key)
    except ValueError:  # the window's first request (add, not set: another process may be first)
        if cache.add(key, 1, timeout=WINDOW_SECONDS * 2):
            return 1
        return cache.incr(key)


@functools.cache
def _redis(location: str):
    """One client per Redis URL for the process (thread-safe, with its connection pool): the
    cache's own makes a client per operation, and with it a table of some 300 reply handlers."""
    import redis

    return redis.Redis.from_url(location)


def _count_all(keys: list[str]) -> list[int]:
    """One more request in each key's window. On Redis one round trip for all of them: each key
    made with its expiry if it is new (SET NX EX), then incremented (INCR keeps the expiry),
    stored as the cache stores an integer, so the cache's own get, incr and delete read them."""
    cache = caches["ratelimit"]
    if not isinstance(cache, RedisCache):
        return [_count(key) for key in keys]
    pipe = _redis(settings.CACHES["ratelimit"]["LOCATION"]).pipeline(transaction=False)
    for key in keys:
        full = cache.make_and_validate_key(key)
        pipe.set(full, 0, ex=WINDOW_SECONDS * 2, nx=True)
        pipe.incr(full)
    return pipe.execute()[1::2]


def rate_limit_hit(principal: AgentPrincipal) -> None:
    """Count one request of this principal; raise RateLimited if its token or its tenant is
    over its limit for the current minute. A request over its token's limit is not counted
    against its tenant (the other tokens of the tenant keep their share)."""
    now = time.time()
    window = int(now // WINDOW_SECONDS)
    # An administrator's own limit for the token or the tenant (admin), else the setting. The
    # principal comes with its tenant (console.api.principal_for_authorization): no query.
    scopes = []
    for scope, ident, own, default in (
        ("token", principal.pk, principal.api_rate_per_minute, settings.API_RATE_PER_TOKEN),
        ("tenant", principal.tenant_id, principal.tenant.api_rate_per_minute, settings.API_RATE_PER_TENANT),
    ):
        limit = default if own is None else own
        if limit:
            scopes.append((scope, f"{scope}:{ident}:{window}", limit))
    if not scopes:
        return
    counts = _count_all([key for _, key, _ in scopes])
    for index, ((scope, _, limit), count) in enumerate(zip(scopes, counts, strict=True)):
        if count > limit:
            # The scopes after this one were counted in the same round trip: take it back.
            for _, later, _ in scopes[index + 1:]:
                caches["ratelimit"].decr(later)
            retry_after = max(1, int((window + 1) * WINDOW_SECONDS - now + 0.999))
            raise RateLimited(
                f"More than {limit} requests a minute for this {scope}; try again in {retry_after} s.",
                retry_after=retry_after, details={"scope": scope, "limit": limit, "retry_after": retry_after},
            )


def rate_limit_reset(principal: AgentPrincipal) -> None:
    """Forget this minute's counts of the principal's token and tenant (an operator's reset)."""
    window = int(time.time() // WINDOW_SECONDS)
    caches["ratelimit"].delete_many([f"{scope}:{ident}:{w}" for scope, ident in
                                     (("token", principal.pk), ("tenant", principal.tenant_id))
                                     for w in (window, window + 1)])


class AgentRateThrottle(BaseThrottle):
    """DRF's throttle hook for the agent API (after authentication): raises RateLimited, which
    the API's exception handler renders with Retry-After."""

    def allow_request(self, request, view) -> bool:
        if isinstance(request.user, AgentPrincipal):
            rate_limit_hit(request.user)
        return True
