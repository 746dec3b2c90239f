"""Authority withdrawn around a dispatch: real threads, their own connections, PostgreSQL row
locks, the real payments sandbox. A dispatch already claimed finishes and is recorded; one not
yet claimed is never sent on the withdrawn authority."""

from __future__ import annotations

import random
import threading
import time

import pytest
from django.db import connection, transaction

from approvals import stops
from approvals.models import ApprovalRequest, PolicyTier, Stop, StopStatus, Tool
from console.lib.errors import Conflict
from console.lib.procs import wait_until
from console.models import AgentPrincipal, Role
from ledger import control, decisions, dispatcher, seams
from ledger.dispatcher import run_dispatch
from ledger.models import Operation, OperationStatus
from tests.conftest import make_user
from tests.factories import make_pending_approval
from tests.fixtures.dispatch import (
    attempts_of,
    authorized_refund,
    backend_waits_on_a_lock,
    effects_of,
    reload,
)

S = OperationStatus
pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="needs PostgreSQL row locks"),
    pytest.mark.usefixtures("sandbox_settings", "enqueued"),
    pytest.mark.timeout(120),
]


@pytest.fixture
def admin(tenant):
    return make_user("boss", tenant, Role.ADMIN)


def at_once(*jobs) -> list[str]:
    """Run the jobs in threads released together; each outcome is its return value or error."""
    start = threading.Barrier(len(jobs))
    outcomes: list[str] = [""] * len(jobs)

    def run(index, job):
        try:
            start.wait(timeout=30)
            outcomes[index] = str(job())
        except Conflict as exc:
            outcomes[index] = f"conflict: {exc.message}"
        except Exception as exc:  # noqa: BLE001 - reported by the assertions
            outcomes[index] = f"error: {exc!r}"
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, job)) for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return outcomes


def test_a_dispatch_claimed_before_the_withdrawal_finishes_and_is_recorded(agent, tools, admin, payments_url,
                                                                          unique, monkeypatch):
    operation = authorized_refund(agent, unique("ord"))
    claimed, withdrawn = threading.Event(), threading.Event()
    real_call = dispatcher._call_provider

    def call_after_the_withdrawal(op, attempt, let_go=None):
        claimed.set()
        assert withdrawn.wait(timeout=30)
        return real_call(op, attempt, let_go)

    monkeypatch.setattr(dispatcher, "_call_provider", call_after_the_withdrawal)
    result: list[str] = []
    worker = threading.Thread(target=lambda: (result.append(run_dispatch(operation.operation_id, worker="A")),
                                              connection.close()))
    worker.start()
    assert claimed.wait(timeout=30)
    # Committed by other connections while worker A holds its claim (committed) and has not sent yet.
    Tool.objects.filter(name="payments.refund").update(enabled=False)
    AgentPrincipal.objects.filter(pk=agent.pk).update(is_active=False)
    stops.stop_create(tenant_id=agent.tenant_id, scope="tenant", user=admin, reason="incident")
    notice = control.authority_notice(reload(operation))
    withdrawn.set()
    worker.join(timeout=60)

    assert result == [S.CONFIRMED]
    assert len(effects_of(payments_url, operation)) == 1
    [attempt] = attempts_of(operation)
    assert attempt.finished_at is not None and attempt.fact == "known_success"
    assert "was claimed before tenant acme was stopped" in notice
    assert "allowed to finish and is recorded" in notice
    # A duplicate delivery afterwards changes nothing.
    assert run_dispatch(operation.operation_id, worker="B") == "noop:confirmed"


@pytest.mark.parametrize("trial", range(5))
def test_a_tool_disabled_while_the_claim_runs_is_never_sent_unless_already_claimed(agent, tools, payments_url,
                                                                                  unique, trial):
    operation = authorized_refund(agent, unique("ord"))

    outcomes = at_once(lambda: run_dispatch(operation.operation_id, worker="A"),
                       lambda: Tool.objects.filter(name="payments.refund").update(enabled=False))

    assert not any(o.startswith("error") for o in outcomes), outcomes
    operation = reload(operation)
    effects = effects_of(payments_url, operation)
    if operation.status == S.CANCELLED:
        assert (outcomes[0], effects, attempts_of(operation)) == ("cancelled:authority_withdrawn", [], [])
    else:
        # The claim committed first: that attempt finished and was recorded.
        assert (outcomes[0], operation.status, len(effects), len(attempts_of(operation))) == (
            S.CONFIRMED, S.CONFIRMED, 1, 1)


@pytest.mark.parametrize("trial", range(5))
def test_an_approval_racing_a_stop_never_reaches_the_provider_while_the_stop_holds(agent, tools, reviewer, admin,
                                                                                   payments_url, trial):
    request = make_pending_approval(agent, risk_tier=3)

    outcomes = at_once(
        lambda: decisions.approval_approve(approval_id=request.approval_id, reviewer=reviewer, reason="ok").status,
        lambda: stops.stop_create(tenant_id=agent.tenant_id, scope="agent", agent=agent, user=admin,
                                  reason="incident").status)

    assert not any(o.startswith("error") for o in outcomes), outcomes
    assert outcomes[1] == "stopped"
    assert outcomes[0] in ("approved", "conflict: Frozen: agent acme/agent is stopped (incident); "
                                      "approve after it is resumed.")
    # Approved just before the stop or frozen by it: either way nothing is sent while it holds.
    result = run_dispatch(request.operation_id, worker="A")
    operation = Operation.objects.get(pk=request.operation_id)
    assert result.startswith("held:stopped:") or result == "noop:planned"
    assert effects_of(payments_url, operation) == []
    assert ApprovalRequest.objects.get(pk=request.pk).status in ("approved", "pending")


WITHDRAWALS = ("tool_disabled", "tool_not_allowed", "agent_deactivated", "tenant_stopped", "tier_forbidden",
               "tier_raised")


def withdraw(kind: str, *, agent, admin) -> None:
    """Take the authority away, committed (autocommit) when this returns."""
    refund = Tool.objects.get(name="payments.refund")
    if kind == "tool_disabled":
        Tool.objects.filter(pk=refund.pk).update(enabled=False)
    elif kind == "tool_not_allowed":
        agent.allowed_tools.remove(refund)
    elif kind == "agent_deactivated":
        AgentPrincipal.objects.filter(pk=agent.pk).update(is_active=False)
    elif kind == "tenant_stopped":
        stops.stop_create(tenant_id=agent.tenant_id, scope="tenant", user=admin, reason="drill")
    elif kind == "tier_forbidden":
        PolicyTier.objects.filter(level=1).update(requirement=PolicyTier.Requirement.FORBIDDEN)
    elif kind == "tier_raised":
        Tool.objects.filter(pk=refund.pk).update(base_tier=3)


def restore(*, agent, admin) -> None:
    refund = Tool.objects.get(name="payments.refund")
    Tool.objects.filter(pk=refund.pk).update(enabled=True, base_tier=1)
    agent.allowed_tools.add(refund)
    AgentPrincipal.objects.filter(pk=agent.pk).update(is_active=True)
    for stop_id in Stop.objects.filter(status=StopStatus.STOPPED).values_list("stop_id", flat=True):
        stops.stop_resume(stop_id=stop_id, user=admin)
    PolicyTier.objects.filter(level=1).update(requirement=PolicyTier.Requirement.RUN_AUDIT)


def test_authority_withdrawn_at_random_moments_is_never_dispatched_on(agent, tools, admin, payments_url, unique,
                                                                       monkeypatch):
    """200 trials: a dispatch and a withdrawal (of six kinds) released together, with random
    jitter on either side. Whenever the withdrawal had committed before the claim began, nothing
    may reach the provider; a claim that began first may finish (and is recorded)."""
    rng = random.Random(13)
    entered: dict[str, float] = {}
    real_claim = dispatcher._claim

    def timed_claim(operation_id, *, worker):
        entered[operation_id] = time.monotonic()
        return real_claim(operation_id, worker=worker)

    monkeypatch.setattr(dispatcher, "_claim", timed_claim)
    tally: dict[str, int] = {"withdrawn_first": 0, "claimed_first": 0}
    violations = []
    for trial in range(200):
        kind = WITHDRAWALS[trial % len(WITHDRAWALS)]
        operation = authorized_refund(agent, unique("ord"))
        # Jitter, not synchronisation (nothing waits for the other by it): up to a few
        # milliseconds on one side, so that the two cross at every point of the claim. A sleep
        # releases the GIL, so the other thread's timestamps stay true.
        dispatch_jitter, withdraw_jitter = rng.choice([(rng.uniform(0, 0.03), 0.0), (0.0, rng.uniform(0, 0.004))])
        withdrawn_at: list[float] = []

        def dispatch(op=operation, jitter=dispatch_jitter):
            time.sleep(jitter)
            return run_dispatch(op.operation_id, worker="A")

        def take_away(kind=kind, jitter=withdraw_jitter, withdrawn_at=withdrawn_at):
            time.sleep(jitter)
            withdraw(kind, agent=agent, admin=admin)
            withdrawn_at.append(time.monotonic())

        outcomes = at_once(dispatch, take_away)
        assert not any(o.startswith("error") for o in outcomes), (kind, outcomes)
        sent = len(attempts_of(operation)) + len(effects_of(payments_url, operation))
        if withdrawn_at[0] < entered[operation.operation_id]:
            tally["withdrawn_first"] += 1
            if sent:
                violations.append((trial, kind, outcomes[0]))
        else:
            tally["claimed_first"] += 1
        outcome = outcomes[0].split(":")[0]
        tally[outcome] = tally.get(outcome, 0) + 1
        restore(agent=agent, admin=admin)

    print(f"\nauthority withdrawn at random moments: {tally}, dispatched on withdrawn authority: {len(violations)}")
    assert violations == []
    assert tally["withdrawn_first"] > 0


@pytest.mark.parametrize("kind", WITHDRAWALS)
def test_a_claim_that_read_its_authority_before_a_withdrawal_commits_before_it_or_not_at_all(
        agent, tools, admin, payments_url, unique, kind):
    """The claim has read the tool, the policy and the agent and is about to commit
    `dispatched` when a withdrawal commits on another connection. Its attempt must be in the
    ledger by the time the withdrawal's commit returns (the withdrawal waited for it), or it
    must not be dispatched at all: never an attempt that commits after the withdrawal."""
    operation = authorized_refund(agent, unique("ord"))
    at_seam, release = threading.Event(), threading.Event()

    def hold_before_the_commit(name: str, operation_id: str) -> None:
        if name == "before_dispatch_commit" and operation_id == operation.operation_id:
            at_seam.set()
            assert release.wait(timeout=30)

    previous = seams.install(hold_before_the_commit)
    withdrawal: dict = {}

    def take_away():
        withdrawal["pid"] = connection.cursor().connection.info.backend_pid
        withdraw(kind, agent=agent, admin=admin)
        withdrawal["attempts_at_commit"] = [a.number for a in attempts_of(operation)]
        connection.close()

    try:
        result: list[str] = []
        worker = threading.Thread(target=lambda: (result.append(run_dispatch(operation.operation_id, worker="A")),
                                                  connection.close()))
        worker.start()
        assert at_seam.wait(timeout=30)
        taker = threading.Thread(target=take_away)
        taker.start()
        # The withdrawal has either committed or is waiting for the claim's locks.
        wait_until(lambda: "attempts_at_commit" in withdrawal or
                   ("pid" in withdrawal and backend_waits_on_a_lock(withdrawal["pid"])),
                   timeout=30, what="the withdrawal to commit or wait", interval=0.01)
        release.set()
        worker.join(timeout=60)
        taker.join(timeout=60)
    finally:
        release.set()
        seams.install(previous)
    numbers = [a.number for a in attempts_of(operation)]
    assert numbers == withdrawal["attempts_at_commit"], (
        f"{kind}: attempts {numbers} in the ledger, {withdrawal['attempts_at_commit']} when the withdrawal "
        f"committed; dispatch said {result}")
    assert len(effects_of(payments_url, operation)) == len(numbers)


@pytest.mark.parametrize("kind", WITHDRAWALS)
def test_a_withdrawal_written_but_not_committed_when_the_claim_starts_is_seen_by_the_claim(
        agent, tools, admin, payments_url, unique, kind):
    """The withdrawal has written (its transaction holds the configuration's generation) when
    the claim starts, and commits while the claim waits for it. The claim must then judge by
    the withdrawn authority: never a dispatch on what was taken away before the claim's commit."""
    operation = authorized_refund(agent, unique("ord"))
    written, release = threading.Event(), threading.Event()

    def take_away():
        with transaction.atomic():
            withdraw(kind, agent=agent, admin=admin)
            written.set()
            assert release.wait(timeout=30)
        connection.close()

    claim: dict = {}

    def dispatch():
        claim["pid"] = connection.cursor().connection.info.backend_pid
        claim["result"] = run_dispatch(operation.operation_id, worker="A")
        connection.close()

    taker = threading.Thread(target=take_away)
    worker = threading.Thread(target=dispatch)
    try:
        taker.start()
        assert written.wait(timeout=30)
        worker.start()
        wait_until(lambda: "pid" in claim and backend_waits_on_a_lock(claim["pid"]), timeout=30,
                   what="the claim to wait for the withdrawal", interval=0.01)
    finally:
        release.set()
        taker.join(timeout=60)
        worker.join(timeout=60)

    assert attempts_of(operation) == [], f"{kind}: dispatched on withdrawn authority ({claim.get('result')})"
    assert effects_of(payments_url, operation) == []
    assert not claim["result"].startswith(("confirmed", "dispatched")), claim["result"]
