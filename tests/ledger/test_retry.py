"""ledger.retry: backoff with full jitter, Retry-After, the retry budget and the circuit breaker —
alone, and as the dispatcher applies them against the real payments provider."""

from __future__ import annotations

import random
import statistics
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import Tool
from ledger.dispatcher import run_dispatch
from ledger.models import Attempt, Fact, OperationStatus, ToolCircuit
from ledger.retry import backoff_bounds, backoff_delay, circuit_open_until, retry_budget_left
from tests.fixtures.dispatch import (
    attempts_of,
    authorized_refund,
    effects_of,
    release_backoff,
    reload,
)

S = OperationStatus
pytestmark = pytest.mark.usefixtures("sandbox_settings", "enqueued")


def policy_tool(*, base: float = 0.5, cap: float = 8.0) -> Tool:
    return Tool(name="t", adapter="noop", json_schema={}, backoff_base_seconds=base, backoff_cap_seconds=cap)


# -- backoff ---------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("attempt_number", "ceiling"),
    [(0, 0.5), (1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 8.0), (6, 8.0), (30, 8.0)],
)
def test_backoff_bounds_double_per_attempt_up_to_the_cap(attempt_number, ceiling):
    assert backoff_bounds(policy_tool(), attempt_number) == (0.0, ceiling)


def test_backoff_uses_full_jitter_over_the_whole_window():
    tool = policy_tool()
    rng = random.Random(20240611)

    delays = [backoff_delay(tool, 3, None, rng=rng) for _ in range(2000)]

    low, high = backoff_bounds(tool, 3)
    assert all(low <= d <= high for d in delays)
    # Full jitter, not "equal jitter" or a fixed delay: the whole [0, ceiling] window is used.
    assert min(delays) < 0.05 * high
    assert max(delays) > 0.95 * high
    assert statistics.mean(delays) == pytest.approx(high / 2, rel=0.1)


def test_backoff_with_the_same_seed_is_reproducible():
    tool = policy_tool()

    def schedule(seed: int) -> list[float]:
        rng = random.Random(seed)
        return [backoff_delay(tool, n, None, rng=rng) for n in range(1, 8)]

    assert schedule(7) == schedule(7)
    assert schedule(7) != schedule(8)
    assert all(0.0 <= d <= backoff_bounds(tool, n)[1] for n, d in enumerate(schedule(7), start=1))


def test_retry_after_is_a_floor_the_jitter_cannot_undercut():
    tool = policy_tool()
    rng = random.Random(1)

    delays = [backoff_delay(tool, 1, 3.0, rng=rng) for _ in range(200)]

    assert all(d == 3.0 for d in delays)  # the jitter window after attempt 1 is only [0, 0.5]


def test_retry_after_below_the_jitter_leaves_the_jitter_in_charge():
    tool = policy_tool()
    rng = random.Random(2)

    delays = [backoff_delay(tool, 5, 0.25, rng=rng) for _ in range(200)]

    assert all(0.25 <= d <= 8.0 for d in delays)
    assert max(delays) > 4.0


def test_an_absurd_retry_after_is_capped():
    tool = policy_tool(cap=8.0)
    assert backoff_delay(tool, 1, 86_400.0, rng=random.Random(3)) == 8.0


@pytest.mark.django_db
def test_the_dispatcher_caps_the_providers_retry_after(agent, tools, unique):
    Tool.objects.filter(name="payments.refund").update(backoff_cap_seconds=0.2)
    operation = authorized_refund(agent, unique("fault-429"))

    assert run_dispatch(operation.operation_id, worker="test") == S.RETRY_SAFE

    operation = reload(operation)
    [attempt] = attempts_of(operation)
    assert attempt.raw_response["retry_after"] == 1.0
    assert operation.not_before <= attempt.finished_at + timedelta(seconds=0.2)


# -- the retry budget ------------------------------------------------------------------------

@pytest.mark.django_db
def test_a_spent_retry_budget_fails_a_not_sent_operation_instead_of_retrying(agent, tools, payments_url, unique,
                                                                           settings):
    settings.RETRY_BUDGET_MIN = 1
    settings.RETRY_BUDGET_RATIO = 0.0
    operation = authorized_refund(agent, unique("fault-429-always"))
    tool = operation.tool
    assert tool.max_attempts > 2

    assert run_dispatch(operation.operation_id, worker="test") == S.RETRY_SAFE  # the one retry allowed
    release_backoff(operation)
    assert run_dispatch(operation.operation_id, worker="test") == S.FAILED  # and no second one

    operation = reload(operation)
    assert operation.attempt_count == 2
    assert operation.last_error == "rate_limited 429"
    assert effects_of(payments_url, operation) == []
    assert not retry_budget_left(tool)
    # The budget is a sliding minute: it refills.
    assert retry_budget_left(tool, now=timezone.now() + timedelta(seconds=61))


@pytest.mark.django_db
def test_the_retry_budget_is_a_share_of_first_attempts(agent, tools, settings, unique):
    settings.RETRY_BUDGET_MIN = 0
    settings.RETRY_BUDGET_RATIO = 0.5
    tool = tools["payments.refund"]
    assert retry_budget_left(tool) is False  # no first attempts, no retries

    def retry_once() -> None:
        operation = authorized_refund(agent, unique("fault-429"))
        assert run_dispatch(operation.operation_id, worker="test") == S.RETRY_SAFE
        release_backoff(operation)
        assert run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED

    run_dispatch(authorized_refund(agent, unique("ord")).operation_id, worker="test")
    retry_once()  # 2 firsts → 1 retry allowed, 1 used
    assert retry_budget_left(tool) is False
    run_dispatch(authorized_refund(agent, unique("ord")).operation_id, worker="test")
    assert retry_budget_left(tool) is True  # 3 firsts → 1.5 allowed, 1 used
    retry_once()  # 4 firsts → 2 allowed, 2 used
    assert retry_budget_left(tool) is False
    assert Attempt.objects.filter(operation__tool=tool, number__gt=1).count() == 2


# -- the circuit breaker ---------------------------------------------------------------------

@pytest.fixture
def circuit(settings):
    settings.CIRCUIT_FAILURES = 3
    settings.CIRCUIT_WINDOW_SECONDS = 30
    settings.CIRCUIT_COOLDOWN_SECONDS = 5
    return settings


def fail_transiently(agent, unique, count: int) -> list:
    operations = []
    for _ in range(count):
        operation = authorized_refund(agent, unique("fault-5xx-before-commit"))
        assert run_dispatch(operation.operation_id, worker="test") == S.RETRY_SAFE
        operations.append(reload(operation))
    return operations


@pytest.mark.django_db
def test_the_circuit_opens_after_enough_transient_failures(agent, tools, payments_url, unique, circuit, enqueued):
    tool = tools["payments.refund"]
    fail_transiently(agent, unique, 2)
    assert circuit_open_until(tool) is None

    fail_transiently(agent, unique, 1)
    reopen = circuit_open_until(tool)

    last_failure = Attempt.objects.filter(operation__tool=tool).order_by("-finished_at")[0].finished_at
    assert reopen == last_failure + timedelta(seconds=5)
    fresh = authorized_refund(agent, unique("ord"))
    enqueued.clear()
    assert run_dispatch(fresh.operation_id, worker="test") == "deferred:circuit_open"
    assert reload(fresh).status == S.AUTHORIZED
    assert attempts_of(fresh) == []
    assert effects_of(payments_url, fresh) == []
    [(operation_id, options)] = enqueued.dispatches
    assert operation_id == fresh.operation_id
    assert 4.0 <= options["countdown"] <= 5.0


@pytest.mark.django_db
def test_an_open_circuit_also_holds_back_retries(agent, tools, payments_url, unique, circuit):
    first, *_ = fail_transiently(agent, unique, 3)
    release_backoff(first)

    assert run_dispatch(first.operation_id, worker="test") == "deferred:circuit_open"
    assert reload(first).attempt_count == 1
    assert effects_of(payments_url, first) == []


@pytest.mark.django_db
def test_the_circuit_closes_after_the_cooldown(agent, tools, payments_url, unique, circuit):
    tool = tools["payments.refund"]
    fail_transiently(agent, unique, 3)
    reopen = circuit_open_until(tool)
    assert reopen is not None

    assert circuit_open_until(tool, now=reopen - timedelta(milliseconds=1)) == reopen
    assert circuit_open_until(tool, now=reopen + timedelta(milliseconds=1)) is None

    # Let the cooldown pass without sleeping: the failures happened six seconds ago.
    Attempt.objects.filter(operation__tool=tool).update(
        started_at=F("started_at") - timedelta(seconds=6), finished_at=F("finished_at") - timedelta(seconds=6)
    )
    fresh = authorized_refund(agent, unique("ord"))
    assert run_dispatch(fresh.operation_id, worker="test") == S.CONFIRMED
    assert len(effects_of(payments_url, fresh)) == 1


@pytest.mark.django_db
def test_failures_outside_the_window_do_not_open_the_circuit(agent, tools, unique, circuit):
    tool = tools["payments.refund"]
    fail_transiently(agent, unique, 3)

    assert circuit_open_until(tool, now=timezone.now() + timedelta(seconds=31)) is None


@pytest.mark.django_db
def test_the_circuit_stays_closed_while_most_calls_succeed(agent, tools, unique, circuit):
    tool = tools["payments.refund"]
    for _ in range(4):
        run_dispatch(authorized_refund(agent, unique("ord")).operation_id, worker="test")
    fail_transiently(agent, unique, 3)

    assert circuit_open_until(tool) is None  # 3 failures of 7: not half


@pytest.mark.django_db
def test_known_failures_do_not_open_the_circuit(agent, tools, unique, circuit):
    tool = tools["payments.refund"]
    for _ in range(4):
        operation = authorized_refund(agent, unique("ord"), currency="XYZ")
        assert run_dispatch(operation.operation_id, worker="test") == S.FAILED

    assert circuit_open_until(tool) is None
    assert Attempt.objects.filter(operation__tool=tool, fact=Fact.KNOWN_FAILURE).count() == 4


# -- the stored verdict (ToolCircuit): what a claim reads instead of counting attempts -----------

def circuit_counts(queries) -> list[str]:
    # COUNT( as a function: the claim's own statement names the attempt_count column.
    return [q["sql"] for q in queries if "ledger_attempt" in q["sql"] and "COUNT(" in q["sql"].upper()]


@pytest.mark.django_db
def test_a_transient_failure_stores_the_breakers_verdict(agent, tools, payments_url, unique, circuit):
    tool = tools["payments.refund"]
    fail_transiently(agent, unique, 2)
    assert ToolCircuit.objects.get(tool=tool).open_until is None  # counted, still closed

    fail_transiently(agent, unique, 1)
    assert ToolCircuit.objects.get(tool=tool).open_until == circuit_open_until(tool)


@pytest.mark.django_db
def test_a_claim_with_the_circuit_closed_counts_no_attempts(agent, tools, payments_url, unique, circuit):
    for _ in range(3):
        run_dispatch(authorized_refund(agent, unique("ord")).operation_id, worker="test")
    fresh = authorized_refund(agent, unique("ord"))
    with CaptureQueriesContext(connection) as queries:
        assert run_dispatch(fresh.operation_id, worker="test") == S.CONFIRMED
    assert circuit_counts(queries.captured_queries) == []


@pytest.mark.django_db
def test_an_open_verdict_is_counted_again_at_the_claim_and_closes_when_the_window_says_so(
        agent, tools, payments_url, unique, circuit):
    tool = tools["payments.refund"]
    fail_transiently(agent, unique, 3)
    fresh = authorized_refund(agent, unique("ord"))
    with CaptureQueriesContext(connection) as queries:
        assert run_dispatch(fresh.operation_id, worker="test") == "deferred:circuit_open"
    assert len(circuit_counts(queries.captured_queries)) == 1

    # Successes since the failures outnumber them: the next claim finds it closed and says so.
    for _ in range(4):
        operation = authorized_refund(agent, unique("ord"))
        Attempt.objects.create(operation=operation, number=99, fencing_token=99, finished_at=timezone.now(),
                               fact=Fact.KNOWN_SUCCESS)
    assert run_dispatch(fresh.operation_id, worker="test") == S.CONFIRMED
    assert ToolCircuit.objects.get(tool=tool).open_until is None
