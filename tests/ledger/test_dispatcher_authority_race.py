"""Authority withdrawn around a dispatch: real threads, their own connections, PostgreSQL row
locks, the real payments sandbox. A dispatch already claimed finishes and is recorded; one not
yet claimed is never sent on the withdrawn authority."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from approvals import stops
from approvals.models import ApprovalRequest, Tool
from console.lib.errors import Conflict
from console.models import AgentPrincipal, Role
from ledger import control, decisions, dispatcher
from ledger.dispatcher import run_dispatch
from ledger.models import Operation, OperationStatus
from tests.conftest import make_user
from tests.factories import make_pending_approval
from tests.fixtures.dispatch import attempts_of, authorized_refund, effects_of, reload

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

    def call_after_the_withdrawal(op, attempt):
        claimed.set()
        assert withdrawn.wait(timeout=30)
        return real_call(op, attempt)

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
