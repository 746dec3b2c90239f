"""The dispatcher protocol, in-process, against the real sandbox providers.

The providers run as subprocesses for the whole session (they are slow to start, and every test
uses fresh keys, so tests cannot see each other's effects). Tool timeouts are short and the
providers' hang is a little longer, so the timeout faults cost well under a second each.

Celery is not involved: tests call `run_dispatch`, `run_reconcile` and `run_sweep` themselves,
and `enqueued` records what would have been published.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from approvals.models import Tool
from ledger.adapters.mail import message_id_for
from ledger.models import Attempt, Operation, OperationStatus
from sandbox import client
from sandbox.process import SandboxProcess
from tests.factories import events_of, make_operation

S = OperationStatus

# The providers hold a fault-timeout-* request this long; the tools give up well before.
HANG_SECONDS = 1.5
PAYMENTS_TIMEOUT = 0.75
MAIL_TIMEOUT = 0.75
GRACE_SECONDS = 0.5


@pytest.fixture(scope="session")
def payments_sandbox() -> Iterator[SandboxProcess]:
    with SandboxProcess.start("payments", hang_seconds=HANG_SECONDS, die_with_parent=True) as proc:
        yield proc


@pytest.fixture(scope="session")
def mail_sandbox() -> Iterator[SandboxProcess]:
    with SandboxProcess.start("mail", hang_seconds=HANG_SECONDS, die_with_parent=True) as proc:
        yield proc


@pytest.fixture
def payments_url(payments_sandbox: SandboxProcess) -> str:
    return payments_sandbox.base_url


@pytest.fixture
def mail_url(mail_sandbox: SandboxProcess) -> str:
    return mail_sandbox.base_url


@pytest.fixture(autouse=True)
def sandbox_settings(settings, payments_sandbox: SandboxProcess, mail_sandbox: SandboxProcess):
    settings.SANDBOX_PAYMENTS_URL = payments_sandbox.base_url
    settings.SANDBOX_MAIL_URL = mail_sandbox.base_url
    settings.SANDBOX_MAIL_SMTP_PORT = mail_sandbox.smtp_port
    settings.DISPATCH_GRACE_SECONDS = GRACE_SECONDS
    # The cast of reviewers is created per test; a slow password hash is not what is tested.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    return settings


@pytest.fixture
def no_service_faults(payments_sandbox: SandboxProcess, mail_sandbox: SandboxProcess) -> Iterator[None]:
    """A test that sets a provider-wide fault does not leak it into the next test."""
    yield
    for proc in (payments_sandbox, mail_sandbox):
        client.clear_fault(proc.base_url)
        client.set_latency(proc.base_url, 0)


@dataclass
class Enqueued:
    """What the dispatcher, reconciler and sweeper would have published to the broker."""

    dispatches: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    reconciles: list[str] = field(default_factory=list)

    def dispatched_ids(self) -> list[str]:
        return [operation_id for operation_id, _ in self.dispatches]

    def clear(self) -> None:
        self.dispatches.clear()
        self.reconciles.clear()


@pytest.fixture(autouse=True)
def enqueued(monkeypatch) -> Enqueued:
    record = Enqueued()

    def enqueue_dispatch(operation_id: str, *, queue: str = "fast", countdown: float | None = None) -> None:
        record.dispatches.append((operation_id, {"queue": queue, "countdown": countdown}))

    def enqueue_reconcile(operation_id: str, *, queue: str = "slow") -> None:
        record.reconciles.append(operation_id)

    monkeypatch.setattr("ledger.tasks.enqueue_dispatch", enqueue_dispatch)
    monkeypatch.setattr("ledger.tasks.enqueue_reconcile", enqueue_reconcile)
    return record


@pytest.fixture
def tools(policy) -> dict[str, Tool]:
    """The seeded tools with short timeouts, so the timeout faults keep the folder fast."""
    Tool.objects.filter(name__in=["payments.refund", "orders.lookup"]).update(timeout_seconds=PAYMENTS_TIMEOUT)
    Tool.objects.filter(name="mail.send").update(timeout_seconds=MAIL_TIMEOUT)
    return {tool.name: tool for tool in Tool.objects.all()}


@pytest.fixture
def unique():
    """A fresh suffix per call: magic values fault the first request *per key*, and the
    providers live for the whole session."""

    def make(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:10]}"

    return make


@pytest.fixture
def free_port() -> int:
    """A port nobody listens on: connecting to it is refused before a byte leaves."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- helpers ---------------------------------------------------------------------------------

def refund_arguments(order_id: str, *, amount: float = 25, currency: str = "EUR") -> dict[str, Any]:
    return {"order_id": order_id, "amount": amount, "currency": currency, "reason": "damaged"}


def authorized_refund(agent, order_id: str, **kwargs: Any) -> Operation:
    """An L1 refund (no approval needed), authorized through the service: dispatchable."""
    return make_operation(agent, "payments.refund", status=S.AUTHORIZED,
                          arguments=refund_arguments(order_id, **kwargs))


def authorized_mail(agent, recipient: str) -> Operation:
    arguments = {"to": [recipient], "subject": "Your refund", "body": "It is on its way."}
    return make_operation(agent, "mail.send", status=S.AUTHORIZED, arguments=arguments)


def effects_of(base_url: str, operation: Operation) -> list[dict[str, Any]]:
    """What the provider committed for this operation's key, counted from outside."""
    if operation.tool.adapter == "mail.send":
        return client.effects(base_url, key=message_id_for(operation.idempotency_key))
    return client.effects(base_url, key=operation.idempotency_key)


def attempts_of(operation: Operation) -> list[Attempt]:
    return list(Attempt.objects.filter(operation_id=operation.operation_id).order_by("number"))


def status_story(operation: Operation) -> list[str]:
    return [event.to_status for event in events_of(Operation.EVENT_ENTITY, operation.operation_id)]


def release_backoff(operation: Operation) -> None:
    """Pass through the backoff without sleeping: the retry is due now."""
    Operation.objects.filter(pk=operation.pk).update(not_before=timezone.now() - timedelta(milliseconds=1))


def reload(operation: Operation) -> Operation:
    operation.refresh_from_db()
    return operation
