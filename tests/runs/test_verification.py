"""A task succeeds only on evidence from the environment: the ledger's receipts and the
provider's records, checked against what was approved."""

from __future__ import annotations

import pytest

from ledger.decisions import lease_acquire
from ledger.dispatcher import run_dispatch
from ledger.models import Fact
from ledger.models import OperationStatus as S
from ledger.sweeper import run_sweep
from runs.models import Task, TaskStatus
from runs.services import task_transition
from runs.verification import run_verification
from sandbox.process import SandboxProcess
from tests.factories import make_operation, make_task, record_outcome

pytestmark = pytest.mark.django_db


def verifying_task(agent, *, task_type="refund", criteria=None, **fields) -> Task:
    task = make_task(agent, task_type=task_type, success_criteria=criteria or [], **fields)
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.VERIFYING)
    task.refresh_from_db()
    return task


def confirmed_refund(agent, task, *, amount=30, receipt_amount=None, order_id="ord-1"):
    operation = make_operation(agent, "payments.refund", task=task, status=S.DISPATCHED,
                               arguments={"order_id": order_id, "amount": amount, "currency": "EUR", "reason": "r"})
    record_outcome(operation, fact=Fact.KNOWN_SUCCESS,
                   receipt={"remote_id": "re_1", "amount": amount if receipt_amount is None else receipt_amount})
    operation.refresh_from_db()
    return operation


def test_a_refund_with_a_receipt_for_the_approved_amount_succeeds(agent):
    task = verifying_task(agent, criteria=[{"kind": "refund_confirmed", "order_id": "ord-1", "amount": 30}])
    confirmed_refund(agent, task)
    assert run_verification(task.task_id) == "met"
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED


def test_a_receipt_whose_amount_differs_from_the_approved_one_does_not_succeed(agent):
    task = verifying_task(agent, criteria=[{"kind": "refund_confirmed", "order_id": "ord-1", "amount": 30}])
    confirmed_refund(agent, task, amount=30, receipt_amount=300)
    assert run_verification(task.task_id) == "failed"
    task.refresh_from_db()
    assert task.status == TaskStatus.FAILED


def test_a_refund_still_in_doubt_sends_the_task_back_to_running(agent):
    task = verifying_task(agent, criteria=[{"kind": "refund_confirmed", "order_id": "ord-1"}])
    make_operation(agent, "payments.refund", task=task, status=S.UNKNOWN,
                   arguments={"order_id": "ord-1", "amount": 30, "currency": "EUR", "reason": "r"})
    assert run_verification(task.task_id) == "pending"
    task.refresh_from_db()
    assert task.status == TaskStatus.RUNNING


def test_a_refund_task_is_judged_by_its_types_check_even_with_no_criteria_of_its_own(agent):
    task = verifying_task(agent, criteria=[])
    assert run_verification(task.task_id) == "failed"  # no refund at all
    task = verifying_task(agent, criteria=[])
    confirmed_refund(agent, task)
    assert run_verification(task.task_id) == "met"
    task.refresh_from_db()
    assert [(v["source"], v["criterion"]["name"], v["result"]) for v in task.verdicts] == [
        ("task type", "refund_confirmed", "met")]


def test_a_refund_task_cannot_succeed_on_a_human_criterion_alone(agent):
    task = verifying_task(agent, criteria=["the customer is happy"])
    assert run_verification(task.task_id) == "failed"
    task.refresh_from_db()
    assert task.status == TaskStatus.FAILED
    # Nobody is asked to review a task whose ledger checks failed.
    assert [(v["criterion"]["kind"], v["result"]) for v in task.verdicts] == [("human", "pending"),
                                                                              ("verifier", "failed")]


def test_the_agents_claim_moves_a_task_to_verifying_and_enqueues_the_verifier(agent, monkeypatch,
                                                                           django_capture_on_commit_callbacks):
    enqueued = []
    monkeypatch.setattr("runs.tasks.enqueue_verification", enqueued.append)
    task = make_task(agent, task_type="refund")
    lease = lease_acquire(task_id=task.task_id, owner="w", ttl_seconds=60)
    version = task.version
    for to in ("planning", "running", "verifying"):
        with django_capture_on_commit_callbacks(execute=True):
            version = task_transition(task_id=task.task_id, to=to, expected_version=version,
                                      fencing_token=lease.fencing_token, actor="agent").version
    assert enqueued == [task.task_id]


def test_a_verification_that_lost_its_message_is_enqueued_again_by_the_sweeper(agent, monkeypatch):
    from datetime import timedelta

    from django.utils import timezone

    task = verifying_task(agent)
    enqueued = []
    monkeypatch.setattr("runs.tasks.enqueue_verification", enqueued.append)
    run_sweep(now=timezone.now() + timedelta(minutes=5))
    assert task.task_id in enqueued


@pytest.fixture(scope="module")
def mail_sandbox():
    with SandboxProcess.start("mail", hang_seconds=1) as sandbox:
        yield sandbox


@pytest.mark.parametrize(("criterion_to", "expected"), [(["ann@example.com"], "met"),
                                                        (["bob@example.com"], "failed")])
def test_an_email_succeeds_only_if_the_provider_holds_it_for_the_approved_recipients(
        agent, mail_sandbox, settings, criterion_to, expected):
    settings.SANDBOX_MAIL_URL = mail_sandbox.base_url
    settings.SANDBOX_MAIL_SMTP_PORT = mail_sandbox.smtp_port
    task = make_task(agent, task_type="contract_email",
                     success_criteria=[{"kind": "mail_delivered", "to": criterion_to}])
    operation = make_operation(agent, "mail.send", task=task, status=S.AUTHORIZED,
                               arguments={"to": ["ann@example.com"], "subject": "Contract", "body": "Signed."})
    assert run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.VERIFYING)
    assert run_verification(task.task_id) == expected
