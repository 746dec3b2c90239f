"""ledger.webhooks: decision webhooks to agents. The event is written in the transaction of the
decision (an outbox), delivered afterwards to a real HTTP receiver, signed per Standard Webhooks
(checked with the `standardwebhooks` package and with the client's `countersign.webhooks`),
retried with backoff, recorded attempt by attempt, and never sent to a non-public address
unless the setting allows it."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
import standardwebhooks
from countersign import webhooks as client_webhooks
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from console.lib import safe_http, standard_webhooks
from console.models import AgentPrincipal
from ledger import decisions, webhooks
from ledger import services as ledger_services
from ledger.models import OperationStatus, WebhookDelivery, WebhookEvent, WebhookStatus
from tests.factories import make_approval_request, make_operation, record_outcome
from tests.fixtures.webhook_receiver import WebhookReceiver

SECRET = standard_webhooks.new_secret()
S = OperationStatus


@pytest.fixture
def receiver():
    with WebhookReceiver() as r:
        yield r


@pytest.fixture
def hooked(agent, receiver, settings) -> AgentPrincipal:
    """The agent with a webhook to the test's receiver (loopback, allowed as in embedded mode)."""
    settings.AGENT_TEST_WEBHOOK_SECRET = SECRET
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    settings.WEBHOOK_BACKOFF_SECONDS = 1.0
    AgentPrincipal.objects.filter(pk=agent.pk).update(webhook_url=receiver.url,
                                                      webhook_secret_ref="AGENT_TEST_WEBHOOK_SECRET")
    agent.refresh_from_db()
    return agent


def _held(agent):
    return make_approval_request(make_operation(agent, arguments={
        "order_id": "ord-7", "amount": 120, "currency": "EUR", "reason": "damaged"}), risk_tier=3)


def _deliver_all(now=None) -> list[WebhookEvent]:
    for event in WebhookEvent.objects.filter(status=WebhookStatus.PENDING):
        webhooks.webhook_deliver(event_pk=event.pk, now=now)
    return list(WebhookEvent.objects.order_by("id"))


# --- the outbox ------------------------------------------------------------------------------


def test_an_approval_writes_a_call_decided_event_in_its_transaction_and_enqueues_it_on_commit(
        hooked, reviewer, django_capture_on_commit_callbacks):
    approval = _held(hooked)

    with django_capture_on_commit_callbacks() as callbacks:
        decisions.approval_approve(approval_id=approval.approval_id, reviewer=reviewer, reason="fine")

    event = WebhookEvent.objects.get()
    assert (event.kind, event.status, event.call_id, event.operation_status) == (
        "call.decided", WebhookStatus.PENDING, approval.call_id, S.AUTHORIZED)
    data = event.payload["data"]
    assert event.payload["type"] == "call.decided"
    assert data["final"] is False
    assert data["decision"]["outcome"] == "approved"
    assert data["decision"]["by"] == "user:reviewer"
    assert data["decision"]["reason"] == "fine"
    assert data["decision"]["url"].startswith("http")
    assert data["task_version"] == hooked.operations.get().task.version
    assert data["operation_id"] == approval.operation_id
    assert any(getattr(cb, "__qualname__", "").startswith("webhooks_plan") for cb in callbacks)


def test_a_rejection_is_a_decision_and_the_end_of_the_call(hooked, reviewer):
    approval = _held(hooked)

    decisions.approval_reject(approval_id=approval.approval_id, reviewer=reviewer, reason="no receipt")

    events = list(WebhookEvent.objects.order_by("id"))
    assert [e.kind for e in events] == ["call.decided", "call.final"]
    assert all(e.payload["data"]["final"] for e in events)
    assert events[0].payload["data"]["decision"] | {"at": None} == events[0].payload["data"]["decision"] | {
        "outcome": "rejected", "reason": "no receipt", "at": None}


def test_an_expiry_by_the_sweeper_is_a_decision(hooked):
    approval = _held(hooked)

    decisions.approval_expire(approval_id=approval.approval_id)

    assert [(e.kind, e.payload["data"]["decision"]["outcome"]) for e in WebhookEvent.objects.order_by("id")] == [
        ("call.decided", "expired"), ("call.final", "expired")]


def test_an_approved_call_refused_at_the_dispatchers_re_check_is_a_decision(hooked):
    operation = make_operation(hooked, status=S.AUTHORIZED)
    WebhookEvent.objects.all().delete()

    ledger_services.operation_cancel(operation_id=operation.operation_id, actor="system:dispatcher",
                                     reason="tool disabled")

    assert [(e.kind, e.payload["data"]["decision"]["outcome"], e.payload["data"]["decision"]["reason"])
            for e in WebhookEvent.objects.order_by("id")] == [("call.decided", "cancelled", "tool disabled"),
                                                              ("call.final", "cancelled", "tool disabled")]


def test_a_rolled_back_decision_leaves_no_event(hooked, reviewer):
    approval = _held(hooked)

    with pytest.raises(RuntimeError), transaction.atomic():
        decisions.approval_approve(approval_id=approval.approval_id, reviewer=reviewer)
        assert WebhookEvent.objects.count() == 1
        raise RuntimeError("the worker died before the commit")

    assert WebhookEvent.objects.count() == 0


def test_a_call_the_gate_ran_at_once_tells_only_that_it_became_final(hooked):
    operation = make_operation(hooked, status=S.DISPATCHED)
    WebhookEvent.objects.all().delete()  # the factory authorizes it the way an approval does

    record_outcome(operation, fact="known_success")

    (event,) = WebhookEvent.objects.all()
    assert (event.kind, event.operation_status, event.payload["data"]["status"]) == ("call.final", S.CONFIRMED,
                                                                                    S.CONFIRMED)


def test_an_agent_without_a_webhook_gets_no_events(agent, reviewer):
    approval = _held(agent)

    decisions.approval_reject(approval_id=approval.approval_id, reviewer=reviewer, reason="no")

    assert WebhookEvent.objects.count() == 0


# --- delivery --------------------------------------------------------------------------------


def test_a_delivery_is_signed_per_standard_webhooks(hooked, reviewer, receiver):
    approval = _held(hooked)
    decisions.approval_approve(approval_id=approval.approval_id, reviewer=reviewer)

    (event,) = _deliver_all()

    (request,) = receiver.wait_for(1)
    assert event.status == WebhookStatus.DELIVERED
    assert request.headers["webhook-id"] == event.webhook_id
    assert request.headers["content-type"] == "application/json"
    # The reference implementation and the client agree with our signature.
    assert standardwebhooks.Webhook(SECRET).verify(request.body, request.headers) == event.payload
    assert client_webhooks.verify(request.headers, request.body, SECRET) == event.payload
    with pytest.raises(client_webhooks.WebhookVerificationError):
        client_webhooks.verify(request.headers, request.body.replace(b"approved", b"rejected"), SECRET)
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(standard_webhooks.new_secret()).verify(request.body, request.headers)
    (attempt,) = WebhookDelivery.objects.all()
    assert (attempt.number, attempt.status_code, attempt.error, attempt.next_retry_at) == (1, 200, "", None)
    assert attempt.duration_ms is not None


def test_a_500_is_retried_later_with_the_same_message_id_until_a_200(hooked, reviewer, receiver):
    receiver.answers = [500]
    decisions.approval_approve(approval_id=_held(hooked).approval_id, reviewer=reviewer)

    (event,) = _deliver_all()
    assert (event.status, event.attempts, event.last_error) == (WebhookStatus.PENDING, 1, "HTTP 500")
    first = WebhookDelivery.objects.get()
    assert first.status_code == 500 and first.next_retry_at == event.next_attempt_at
    assert event.next_attempt_at > timezone.now()
    # Not due yet: a duplicate message sends nothing.
    assert webhooks.webhook_deliver(event_pk=event.pk) == (event, False)

    (event,) = _deliver_all(now=event.next_attempt_at + timedelta(seconds=1))

    requests = receiver.wait_for(2)
    assert event.status == WebhookStatus.DELIVERED
    assert [a.status_code for a in WebhookDelivery.objects.order_by("number")] == [500, 200]
    assert requests[0].headers["webhook-id"] == requests[1].headers["webhook-id"] == event.webhook_id


def test_attempts_are_bounded(hooked, reviewer, receiver, settings):
    settings.WEBHOOK_MAX_ATTEMPTS = 2
    receiver.answers = [503, 503]
    decisions.approval_approve(approval_id=_held(hooked).approval_id, reviewer=reviewer)

    _deliver_all()
    (event,) = _deliver_all(now=timezone.now() + timedelta(hours=1))

    assert (event.status, event.attempts, event.next_attempt_at) == (WebhookStatus.FAILED, 2, None)
    assert WebhookDelivery.objects.order_by("number").last().next_retry_at is None


def test_a_redirect_is_not_followed(hooked, reviewer, receiver):
    receiver.answers = [307]
    decisions.approval_approve(approval_id=_held(hooked).approval_id, reviewer=reviewer)

    (event,) = _deliver_all()

    (request,) = receiver.wait_for(1)
    assert request.path == "/hooks/countersign"
    assert event.status == WebhookStatus.PENDING
    assert "redirect not followed" in event.last_error


def test_410_gone_fails_the_event_and_disables_the_agents_webhook(hooked, reviewer, receiver):
    receiver.answers = [410]
    decisions.approval_reject(approval_id=_held(hooked).approval_id, reviewer=reviewer, reason="no")

    events = _deliver_all()

    assert len(receiver.wait_for(1)) == 1  # the second event was not sent after the 410
    assert [e.status for e in events] == [WebhookStatus.FAILED, WebhookStatus.FAILED]
    assert "410" in events[0].last_error and "disabled" in events[1].last_error
    hooked.refresh_from_db()
    assert hooked.webhook_disabled_at is not None
    decisions.approval_reject(approval_id=_held(hooked).approval_id, reviewer=reviewer, reason="no")
    assert WebhookEvent.objects.count() == 2  # a disabled webhook plans nothing


def test_a_missing_secret_fails_at_once_and_sends_nothing(hooked, reviewer, receiver, settings):
    del settings.AGENT_TEST_WEBHOOK_SECRET
    decisions.approval_approve(approval_id=_held(hooked).approval_id, reviewer=reviewer)

    (event,) = _deliver_all()

    assert event.status == WebhookStatus.FAILED
    assert "AGENT_TEST_WEBHOOK_SECRET is not set" in event.last_error
    assert receiver.received == []


def test_the_backoff_doubles_up_to_its_cap_with_jitter(settings):
    settings.WEBHOOK_BACKOFF_SECONDS = 2
    settings.WEBHOOK_BACKOFF_CAP_SECONDS = 60
    rng = random.Random(7)
    waits = {n: [webhooks.backoff_seconds(n, rng=rng) for _ in range(200)] for n in (1, 2, 3, 10)}

    assert 1 <= min(waits[1]) and max(waits[1]) <= 2
    assert 2 <= min(waits[2]) and max(waits[2]) <= 4
    assert 4 <= min(waits[3]) and max(waits[3]) <= 8
    assert 30 <= min(waits[10]) and max(waits[10]) <= 60
    assert len(set(waits[3])) > 100  # jittered, not one value


def test_beat_re_enqueues_due_events(hooked, reviewer, monkeypatch):
    decisions.approval_approve(approval_id=_held(hooked).approval_id, reviewer=reviewer)
    enqueued = []
    monkeypatch.setattr("ledger.tasks.enqueue_webhook", lambda pk, countdown=None: enqueued.append(pk))

    assert webhooks.webhooks_enqueue_due(now=timezone.now() + timedelta(seconds=1)) == 1
    assert enqueued == [WebhookEvent.objects.get().pk]


# --- never inside ----------------------------------------------------------------------------


def test_in_production_a_receiver_on_loopback_is_refused_and_never_reached(hooked, reviewer, receiver, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    decisions.approval_approve(approval_id=_held(hooked).approval_id, reviewer=reviewer)

    (event,) = _deliver_all()

    assert receiver.received == []
    assert event.status == WebhookStatus.FAILED
    assert "non-public address (127.0.0.1)" in event.last_error
    assert WebhookDelivery.objects.get().status_code is None


def test_a_host_name_is_judged_by_the_address_it_resolves_to(receiver):
    url = receiver.url.replace("127.0.0.1", "localhost")

    with pytest.raises(safe_http.RefusedAddress, match="localhost resolves to a non-public address"):
        safe_http.post(url, content=b"{}", headers={}, timeout=2)

    assert receiver.received == []


def test_allowed_private_addresses_connect_to_the_address_that_was_checked(receiver):
    backend = safe_http.GuardedBackend(allow_private=True)
    stream = backend.connect_tcp("localhost", receiver.port, timeout=2)
    stream.close()

    assert safe_http.is_public(backend.connected_to) is False
    assert backend.connected_to in ("127.0.0.1", "::1")


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
                                     "100.64.0.1", "0.0.0.0", "::1", "fe80::1", "fd00::1", "::ffff:127.0.0.1",
                                     "::ffff:169.254.169.254", "224.0.0.1", "255.255.255.255"])
def test_non_public_addresses_are_not_public(address):
    assert not safe_http.is_public(address)


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111"])
def test_public_addresses_are_public(address):
    assert safe_http.is_public(address)


@pytest.mark.parametrize(("url", "why"), [("file:///etc/passwd", "only http and https"),
                                          ("gopher://example.com/", "only http and https"),
                                          ("http://user:pw@example.com/", "credentials"),
                                          ("http:///nohost", "no host")])
def test_urls_no_setting_allows_are_refused(url, why):
    with pytest.raises(safe_http.RefusedAddress, match=why):
        safe_http.post(url, content=b"", headers={}, timeout=1, allow_private=True)


# --- where people see them -------------------------------------------------------------------


def test_the_operation_page_shows_the_agents_webhooks_and_their_attempts(hooked, reviewer, receiver, client):
    receiver.answers = [500]
    approval = _held(hooked)
    decisions.approval_approve(approval_id=approval.approval_id, reviewer=reviewer)
    (event,) = _deliver_all()
    client.force_login(reviewer)

    page = client.get(reverse("operations:detail", args=[approval.operation_id]))

    assert page.status_code == 200
    section = page.content.decode().split('id="op-webhooks"', 1)[1]
    assert event.webhook_id in section
    assert "call.decided" in section and "pending" in section
    assert "attempt 1" in section and "HTTP 500" in section and "retry at" in section
