"""The adapters classify every answer of the real providers into the four facts (docs/architecture.md).

not sent: no byte left, or the provider promised no effect · known failure: the provider
promised no effect, and the same input will not work · unknown: only a query can tell ·
known success: a receipt.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest

from ledger.adapters import get_adapter
from ledger.adapters.base import ABSENT, ERROR, FOUND, PROCESSING, Outcome
from ledger.adapters.mail import message_id_for
from ledger.models import Fact
from sandbox import client
from tests.fixtures.dispatch import HANG_SECONDS, refund_arguments

pytestmark = pytest.mark.usefixtures("sandbox_settings", "enqueued")

TIMEOUT = 0.5

refunds = get_adapter("payments.refund")
mail = get_adapter("mail.send")
lookup = get_adapter("orders.lookup")


def refund(order_id: str, *, key: str, timeout: float = TIMEOUT, **kwargs: Any) -> Outcome:
    return refunds.execute(refund_arguments(order_id, **kwargs), key=key, timeout=timeout)


def send_mail(recipient: str, *, key: str, timeout: float = TIMEOUT) -> Outcome:
    arguments = {"to": [recipient], "subject": "Your refund", "body": "It is on its way."}
    return mail.execute(arguments, key=key, timeout=timeout)


# -- payments: execute -----------------------------------------------------------------------

def test_a_201_is_a_known_success_with_the_providers_receipt(payments_url, unique):
    key = unique("key")

    outcome = refund(unique("ord"), key=key)

    [effect] = client.effects(payments_url, key=key)
    assert (outcome.fact, outcome.transport, outcome.provider_status) == (Fact.KNOWN_SUCCESS, "ok", "201")
    assert outcome.side_effect == "committed"
    assert outcome.receipt["remote_id"] == effect["payload"]["id"]
    assert outcome.receipt["replayed"] is False


def test_a_replayed_answer_for_the_same_key_is_the_same_success_without_a_second_effect(payments_url, unique):
    key, order_id = unique("key"), unique("ord")
    first = refund(order_id, key=key)

    again = refund(order_id, key=key)

    assert again.fact == Fact.KNOWN_SUCCESS
    assert again.receipt["replayed"] is True
    assert again.receipt["remote_id"] == first.receipt["remote_id"]
    assert len(client.effects(payments_url, key=key)) == 1


def test_the_same_key_with_another_payload_is_a_known_failure(payments_url, unique):
    key, order_id = unique("key"), unique("ord")
    refund(order_id, key=key, amount=10)

    outcome = refund(order_id, key=key, amount=11)

    assert (outcome.fact, outcome.error_class, outcome.error_code) == (Fact.KNOWN_FAILURE, "key_conflict", "422")
    assert outcome.data_status == "conflict"
    assert len(client.effects(payments_url, key=key)) == 1


def test_a_validation_error_is_a_known_failure_with_no_effect(payments_url, unique):
    key = unique("key")

    outcome = refund(unique("ord"), key=key, currency="XYZ")

    assert (outcome.fact, outcome.error_class, outcome.error_code) == (Fact.KNOWN_FAILURE, "validation", "400")
    assert outcome.side_effect == "none"
    assert client.effects(payments_url, key=key) == []


def test_a_429_is_not_sent_and_carries_the_retry_after(payments_url, unique):
    key = unique("key")

    outcome = refund(unique("fault-429"), key=key)

    assert (outcome.fact, outcome.error_class, outcome.error_code) == (Fact.NOT_SENT, "rate_limited", "429")
    assert outcome.retry_after == 1.0
    assert outcome.side_effect == "none"
    assert client.effects(payments_url, key=key) == []


def test_a_503_before_commit_is_not_sent(payments_url, unique):
    key = unique("key")

    outcome = refund(unique("fault-5xx-before-commit"), key=key)

    assert (outcome.fact, outcome.error_class, outcome.error_code) == (Fact.NOT_SENT, "unavailable", "503")
    assert client.effects(payments_url, key=key) == []


def test_a_500_is_unknown_because_the_provider_may_have_committed(payments_url, unique):
    key = unique("key")

    outcome = refund(unique("fault-5xx-after-commit"), key=key)

    assert (outcome.fact, outcome.error_class, outcome.error_code) == (Fact.UNKNOWN, "server_error", "500")
    assert len(client.effects(payments_url, key=key)) == 1  # it had


def test_a_read_timeout_is_unknown_never_a_failure(payments_url, unique):
    key = unique("key")

    outcome = refund(unique("fault-timeout-after-commit"), key=key)

    assert (outcome.fact, outcome.transport, outcome.error_class) == (Fact.UNKNOWN, "timeout", "timeout")
    assert outcome.side_effect == "unknown"
    assert len(client.effects(payments_url, key=key)) == 1


def test_a_timeout_before_the_provider_committed_is_still_unknown_to_the_caller(payments_url, unique):
    key = unique("key")

    outcome = refund(unique("fault-timeout-before-commit"), key=key)

    assert (outcome.fact, outcome.error_class) == (Fact.UNKNOWN, "timeout")


def test_a_lost_reply_is_unknown(payments_url, unique):
    key = unique("key")

    outcome = refund(unique("fault-lost-reply"), key=key)

    assert (outcome.fact, outcome.transport, outcome.error_class) == (Fact.UNKNOWN, "reset", "reset")
    assert len(client.effects(payments_url, key=key)) == 1


def test_a_provider_that_dies_mid_request_is_unknown(payments_url, unique):
    key = unique("key")

    outcome = refund(unique("fault-crash"), key=key)

    client.wait_healthy(payments_url)
    assert (outcome.fact, outcome.error_class) == (Fact.UNKNOWN, "reset")
    assert len(client.effects(payments_url, key=key)) == 1


def test_a_refused_connection_is_not_sent(settings, free_port, unique):
    settings.SANDBOX_PAYMENTS_URL = f"http://127.0.0.1:{free_port}"

    outcome = refund(unique("ord"), key=unique("key"))

    assert (outcome.fact, outcome.transport, outcome.error_class) == (Fact.NOT_SENT, "connect_error", "connect")
    assert outcome.side_effect == "none"


def test_a_409_while_the_same_key_is_in_flight_is_unknown(payments_url, unique):
    key, order_id = unique("key"), unique("fault-timeout-before-commit")
    first: dict[str, Outcome] = {}
    holder = threading.Thread(target=lambda: first.setdefault("outcome", refund(order_id, key=key, timeout=5)))
    holder.start()
    try:
        client.wait_for(lambda: refunds.query(key=key, timeout=1).state == PROCESSING, timeout=5,
                        what="the first request to be in flight")

        outcome = refund(order_id, key=key)
    finally:
        holder.join(timeout=HANG_SECONDS + 5)

    assert (outcome.fact, outcome.error_class, outcome.error_code) == (Fact.UNKNOWN, "in_flight", "409")
    assert first["outcome"].fact == Fact.UNKNOWN  # the provider walked away without a reply


# -- payments: query -------------------------------------------------------------------------

def test_a_query_finds_a_committed_refund_with_a_receipt(payments_url, unique):
    key = unique("key")
    created = refund(unique("ord"), key=key)

    answer = refunds.query(key=key, timeout=TIMEOUT)

    assert answer.state == FOUND
    assert answer.receipt["remote_id"] == created.receipt["remote_id"]
    assert answer.receipt["via"] == "query"


def test_a_query_for_an_unknown_key_is_absent(payments_url, unique):
    assert refunds.query(key=unique("key"), timeout=TIMEOUT).state == ABSENT


def test_a_query_for_a_key_that_failed_validation_is_absent(payments_url, unique):
    key = unique("key")
    refund(unique("ord"), key=key, currency="XYZ")

    answer = refunds.query(key=key, timeout=TIMEOUT)

    assert answer.state == ABSENT
    assert answer.raw["body"]["state"] == "failed"


def test_a_query_about_an_opaque_key_cannot_tell(payments_url, unique):
    key = unique("key")
    refund(unique("fault-opaque"), key=key)

    assert refunds.query(key=key, timeout=TIMEOUT).state == ERROR
    assert len(client.effects(payments_url, key=key)) == 1


def test_a_query_the_provider_refuses_cannot_tell(payments_url, unique, no_service_faults):
    key = unique("key")
    refund(unique("ord"), key=key)
    client.set_fault(payments_url, "429", count=1, target="reads")

    assert refunds.query(key=key, timeout=TIMEOUT).state == ERROR
    assert refunds.query(key=key, timeout=TIMEOUT).state == FOUND


def test_a_query_to_an_unreachable_provider_cannot_tell(settings, free_port, unique):
    settings.SANDBOX_PAYMENTS_URL = f"http://127.0.0.1:{free_port}"
    assert refunds.query(key=unique("key"), timeout=TIMEOUT).state == ERROR


# -- orders.lookup ---------------------------------------------------------------------------

def test_a_lookup_is_a_known_success_without_an_effect(payments_url, unique):
    order_id = unique("ord")

    outcome = lookup.execute({"order_id": order_id}, key=unique("key"), timeout=TIMEOUT)

    assert outcome.fact == Fact.KNOWN_SUCCESS
    assert outcome.receipt == {"order_id": order_id, "read": True}
    assert outcome.result["order_id"] == order_id


def test_a_lookup_of_a_missing_order_is_a_known_failure(payments_url, unique):
    outcome = lookup.execute({"order_id": unique("missing")}, key=unique("key"), timeout=TIMEOUT)
    assert (outcome.fact, outcome.error_code) == (Fact.KNOWN_FAILURE, "404")


# -- mail ------------------------------------------------------------------------------------

def mail_effects(mail_url: str, key: str) -> list[dict[str, Any]]:
    return client.effects(mail_url, key=message_id_for(key))


def test_a_250_is_a_known_success_with_the_message_id(mail_url, unique):
    key = unique("key")

    outcome = send_mail(f"{unique('customer')}@example.com", key=key)

    assert (outcome.fact, outcome.provider_status) == (Fact.KNOWN_SUCCESS, "250")
    assert outcome.receipt["message_id"] == message_id_for(key)
    assert len(mail_effects(mail_url, key)) == 1


def test_a_refused_recipient_is_a_known_failure(mail_url, unique):
    key = unique("key")

    outcome = send_mail(f"{unique('reject')}@example.com", key=key)

    assert (outcome.fact, outcome.error_class, outcome.error_code) == (Fact.KNOWN_FAILURE, "validation", "550")
    assert mail_effects(mail_url, key) == []


def test_a_451_after_the_data_is_not_sent_never_a_success(mail_url, unique):
    key = unique("key")

    outcome = send_mail(f"{unique('fault-429')}@example.com", key=key)

    assert (outcome.fact, outcome.error_class, outcome.error_code) == (Fact.NOT_SENT, "unavailable", "451")
    assert outcome.raw["smtp_code"] == 451
    assert mail_effects(mail_url, key) == []


def test_a_451_from_a_provider_that_kept_the_message_anyway_is_not_sent(mail_url, unique):
    """The sandbox's fault-5xx-after-commit breaks SMTP's promise on purpose: only the
    dispatcher's pre-send query protects the retry from a duplicate (see test_dispatcher)."""
    key = unique("key")

    outcome = send_mail(f"{unique('fault-5xx-after-commit')}@example.com", key=key)

    assert (outcome.fact, outcome.error_code) == (Fact.NOT_SENT, "451")
    assert len(mail_effects(mail_url, key)) == 1


def test_a_mail_timeout_after_the_data_is_unknown(mail_url, unique):
    key = unique("key")

    outcome = send_mail(f"{unique('fault-timeout-after-commit')}@example.com", key=key)

    assert (outcome.fact, outcome.side_effect) == (Fact.UNKNOWN, "unknown")
    # smtplib reports a reply that timed out as a disconnection, hence "reset".
    assert outcome.error_class in ("timeout", "reset")
    assert len(mail_effects(mail_url, key)) == 1


def test_a_mail_connection_dropped_after_the_data_is_unknown(mail_url, unique):
    key = unique("key")

    outcome = send_mail(f"{unique('fault-lost-reply')}@example.com", key=key)

    assert (outcome.fact, outcome.error_class) == (Fact.UNKNOWN, "reset")
    assert len(mail_effects(mail_url, key)) == 1


def test_a_refused_smtp_connection_is_not_sent(settings, free_port, unique):
    settings.SANDBOX_MAIL_SMTP_PORT = free_port

    outcome = send_mail(f"{unique('customer')}@example.com", key=unique("key"))

    assert (outcome.fact, outcome.error_class, outcome.error_code) == (Fact.NOT_SENT, "connect", "ECONNREFUSED")


def test_a_mail_query_finds_a_delivered_message(mail_url, unique):
    key = unique("key")
    recipient = f"{unique('customer')}@example.com"
    send_mail(recipient, key=key)

    answer = mail.query(key=key, timeout=TIMEOUT)

    assert answer.state == FOUND
    assert answer.receipt["message_id"] == message_id_for(key)
    assert answer.receipt["to"] == [recipient]


def test_a_mail_query_for_an_unsent_message_is_absent(mail_url, unique):
    assert mail.query(key=unique("key"), timeout=TIMEOUT).state == ABSENT


def test_a_mail_query_about_an_opaque_message_cannot_tell(mail_url, unique):
    key = unique("key")
    send_mail(f"{unique('fault-opaque')}@example.com", key=key)

    assert mail.query(key=key, timeout=TIMEOUT).state == ERROR


@pytest.mark.parametrize("adapter_name", ["payments.refund", "mail.send"])
def test_write_adapters_can_be_asked_by_key(adapter_name):
    assert get_adapter(adapter_name).can_query is True


def test_an_unknown_adapter_name_is_a_lookup_error():
    with pytest.raises(LookupError, match="No adapter named"):
        get_adapter("nope")


def test_one_http_client_per_process_shared_by_its_threads_and_never_inherited_by_a_child():
    """Building a client per call cost more than a local provider's answer; a forked child must
    not share its parent's sockets."""
    import os

    from ledger.adapters.http import client as http_client

    mine = http_client()
    seen: list[int] = []
    threads = [threading.Thread(target=lambda: seen.append(id(http_client()))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(seen) == {id(mine)}

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports whether it got a client of its own
        os.write(write, b"own" if http_client() is not mine else b"inherited")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 16) == b"own"



def test_an_outcomes_evidence_is_every_field_of_it():
    outcome = Outcome(fact="known_success", transport="ok", provider_status="201", receipt={"id": "re_1"},
                      result={"rows": [1, 2]}, raw={"status": 201, "body": {"id": "re_1"}}, retry_after=1.5)

    assert outcome.as_evidence() == dataclasses.asdict(outcome)
