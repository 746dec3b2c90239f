"""Retry policy: exponential backoff with full jitter, Retry-After, a retry budget and a
circuit breaker per tool. The state lives in the attempts table, so every worker sees it."""

from __future__ import annotations

import random
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, Max, Q
from django.utils import timezone

from approvals.models import Tool
from ledger.models import Attempt, Fact, ToolCircuit

TRANSIENT_ERRORS = ("timeout", "unavailable", "connect", "server_error", "reset", "rate_limited")


def backoff_bounds(tool: Tool, attempt_number: int) -> tuple[float, float]:
    """The full-jitter window after `attempt_number` failed: [0, min(cap, base·2^(n-1))]."""
    ceiling = min(tool.backoff_cap_seconds, tool.backoff_base_seconds * (2 ** max(0, attempt_number - 1)))
    return 0.0, ceiling


def backoff_delay(tool: Tool, attempt_number: int, retry_after: float | None, *, rng=random) -> float:
    low, high = backoff_bounds(tool, attempt_number)
    delay = rng.uniform(low, high)
    if retry_after is not None:
        # The provider said when; never earlier, and never absurdly later than our cap.
        delay = max(delay, min(retry_after, tool.backoff_cap_seconds))
    return delay


def retry_budget_left(tool: Tool, *, now=None) -> bool:
    """Retries over the last minute stay within a share of first attempts, so a struggling
    provider is not hammered by every caller's retries at once."""
    since = (now or timezone.now()) - timedelta(seconds=60)
    counts = Attempt.objects.filter(operation__tool=tool, started_at__gte=since).aggregate(
        firsts=Count("id", filter=Q(number=1)), retries=Count("id", filter=Q(number__gt=1))
    )
    allowed = max(settings.RETRY_BUDGET_MIN, settings.RETRY_BUDGET_RATIO * counts["firsts"])
    return counts["retries"] < allowed


def circuit_open_until(tool: Tool, *, now=None):
    """When the circuit is open, the time it may close; otherwise None."""
    now = now or timezone.now()
    since = now - timedelta(seconds=settings.CIRCUIT_WINDOW_SECONDS)
    stats = Attempt.objects.filter(operation__tool=tool, started_at__gte=since, finished_at__isnull=False).aggregate(
        total=Count("id"),
        failures=Count("id", filter=Q(fact__in=[Fact.UNKNOWN, Fact.NOT_SENT], error_class__in=TRANSIENT_ERRORS)),
        last_failure=Max("finished_at", filter=Q(fact__in=[Fact.UNKNOWN, Fact.NOT_SENT],
                                                 error_class__in=TRANSIENT_ERRORS)),
    )
    if stats["failures"] < settings.CIRCUIT_FAILURES or stats["failures"] * 2 < stats["total"]:
        return None
    reopen = stats["last_failure"] + timedelta(seconds=settings.CIRCUIT_COOLDOWN_SECONDS)
    return reopen if reopen > now else None


def is_transient_failure(fact: str, error_class: str) -> bool:
    """An outcome the circuit breaker counts against its tool."""
    return fact in (Fact.UNKNOWN, Fact.NOT_SENT) and error_class in TRANSIENT_ERRORS


def circuit_store(tool_id: int, open_until) -> None:
    """Keep the breaker's verdict where the claim reads it (one upsert, no row lock held)."""
    ToolCircuit.objects.bulk_create(
        [ToolCircuit(tool_id=tool_id, open_until=open_until, updated_at=timezone.now())],
        update_conflicts=True, unique_fields=["tool"], update_fields=["open_until", "updated_at"],
    )


def circuit_note_failure(tool: Tool) -> None:
    """After a transient failure is recorded: count the window and store the verdict, open or not."""
    circuit_store(tool.pk, circuit_open_until(tool))


def circuit_still_open(tool: Tool, stored_until, *, now):
    """At a claim: None when the stored verdict is closed or lapsed (the common case, no query).
    Otherwise the window is counted again (successes since, a cooldown run out) and the fresh
    verdict stored; it returns when the circuit may close, or None."""
    if stored_until is None or stored_until <= now:
        return None
    reopen = circuit_open_until(tool, now=now)
    if reopen != stored_until:
        circuit_store(tool.pk, reopen)
    return reopen
