"""The mail sandbox, end to end: SMTP in, effects and queries out over HTTP."""

from __future__ import annotations

import smtplib
import socket
from collections.abc import Callable
from email.message import EmailMessage
from urllib.parse import quote

import httpx
import pytest

from sandbox import client
from sandbox.process import SandboxProcess

Unique = Callable[[str], str]


def message(to: str, message_id: str, subject: str = "Your refund") -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = "support@acme.example"
    msg["To"] = to
    msg["Subject"] = subject
    msg["Message-ID"] = message_id
    msg.set_content("We refunded your order.\nRegards")
    return msg


def send(sandbox: SandboxProcess, msg: EmailMessage, *, timeout: float = 5.0) -> None:
    assert sandbox.smtp_port is not None
    # A new connection per attempt, like an adapter retrying after a failure.
    with smtplib.SMTP(sandbox.host, sandbox.smtp_port, timeout=timeout) as smtp:
        smtp.send_message(msg)


def query(sandbox: SandboxProcess, message_id: str) -> httpx.Response:
    return httpx.get(f"{sandbox.base_url}/messages/{quote(message_id, safe='')}", timeout=5.0)


def deliveries(sandbox: SandboxProcess, message_id: str) -> int:
    return len(client.effects(sandbox.base_url, key=message_id))


def test_a_delivered_message_is_an_effect_found_by_its_message_id(
    mail: SandboxProcess, unique: Unique
) -> None:
    message_id = f"<{unique('op')}@countersign.test>"

    send(mail, message("bob@example.com", message_id))

    effects = client.effects(mail.base_url, key=message_id)
    assert len(effects) == 1
    assert effects[0]["key"] == message_id
    assert effects[0]["payload"] == {
        "to": ["bob@example.com"],
        "from": "support@acme.example",
        "mail_from": "support@acme.example",
        "subject": "Your refund",
        "body": "We refunded your order.\nRegards\n",
        "message_id": message_id,
    }
    for spelling in (message_id, message_id.strip("<>")):
        found = query(mail, spelling)
        assert found.status_code == 200
        assert found.json()["found"] is True
        assert found.json()["message"]["message_id"] == message_id
        assert found.json()["deliveries"] == 1
    assert deliveries(mail, message_id.strip("<>")) == 1


def test_an_unknown_message_is_not_found(mail: SandboxProcess, unique: Unique) -> None:
    response = query(mail, f"<{unique('never')}@countersign.test>")
    assert response.status_code == 404
    assert response.json() == {"found": False, "in_flight": False}


def test_a_blind_resend_is_a_visible_duplicate(mail: SandboxProcess, unique: Unique) -> None:
    message_id = f"<{unique('op')}@countersign.test>"

    send(mail, message("bob@example.com", message_id))
    send(mail, message("bob@example.com", message_id))

    assert deliveries(mail, message_id) == 2
    assert query(mail, message_id).json()["deliveries"] == 2


def test_a_rejected_recipient_is_a_permanent_failure_without_effect(
    mail: SandboxProcess, unique: Unique
) -> None:
    message_id = f"<{unique('op')}@countersign.test>"

    with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
        send(mail, message("reject@example.com", message_id))

    code, text = refused.value.recipients["reject@example.com"]
    assert code == 550
    assert text.startswith(b"5.1.1")
    assert deliveries(mail, message_id) == 0


@pytest.mark.parametrize(
    ("fault", "enhanced"), [("429", b"4.7.1"), ("5xx-before-commit", b"4.3.0")]
)
def test_temporary_failures_before_commit_leave_no_effect(
    mail: SandboxProcess, unique: Unique, fault: str, enhanced: bytes
) -> None:
    message_id = f"<{unique('op')}@countersign.test>"
    msg = message(f"fault-{fault}@example.com", message_id)

    with pytest.raises(smtplib.SMTPDataError) as failed:
        send(mail, msg)

    assert failed.value.smtp_code == 451
    assert failed.value.smtp_error.startswith(enhanced)
    assert deliveries(mail, message_id) == 0
    send(mail, msg)  # first attempt only
    assert deliveries(mail, message_id) == 1


def test_5xx_after_commit_delivers_so_a_blind_retry_duplicates(
    mail: SandboxProcess, unique: Unique
) -> None:
    message_id = f"<{unique('op')}@countersign.test>"
    msg = message("fault-5xx-after-commit@example.com", message_id)

    with pytest.raises(smtplib.SMTPDataError) as failed:
        send(mail, msg)

    assert failed.value.smtp_code == 451
    assert deliveries(mail, message_id) == 1
    assert query(mail, message_id).status_code == 200  # what a reconciler should have asked
    send(mail, msg)
    assert deliveries(mail, message_id) == 2


def test_always_faults_strike_every_attempt(mail: SandboxProcess, unique: Unique) -> None:
    message_id = f"<{unique('op')}@countersign.test>"
    msg = message("fault-429-always-7f3a@example.com", message_id)

    for _ in range(3):
        with pytest.raises(smtplib.SMTPDataError):
            send(mail, msg)

    assert deliveries(mail, message_id) == 0


def test_timeout_after_commit_delivers_before_the_client_gives_up(
    mail: SandboxProcess, unique: Unique, client_timeout: float
) -> None:
    message_id = f"<{unique('op')}@countersign.test>"

    with pytest.raises((TimeoutError, socket.timeout, smtplib.SMTPServerDisconnected)):
        send(
            mail,
            message("fault-timeout-after-commit@example.com", message_id),
            timeout=client_timeout,
        )

    client.wait_for(lambda: deliveries(mail, message_id) == 1, timeout=5, what="the delivery")
    assert query(mail, message_id).status_code == 200


def test_timeout_before_commit_is_abandoned_without_effect(
    mail: SandboxProcess, unique: Unique, client_timeout: float
) -> None:
    message_id = f"<{unique('op')}@countersign.test>"

    with pytest.raises((TimeoutError, socket.timeout, smtplib.SMTPServerDisconnected)):
        send(
            mail,
            message("fault-timeout-before-commit@example.com", message_id),
            timeout=client_timeout,
        )

    # The server still holds the DATA after the client left; then it walks away.
    client.wait_for(
        lambda: query(mail, message_id).json() == {"found": False, "in_flight": True},
        timeout=5,
        what="the DATA to be held",
    )
    client.wait_for(
        lambda: query(mail, message_id).json()["in_flight"] is False,
        timeout=5,
        what="the held DATA to be abandoned",
    )
    assert deliveries(mail, message_id) == 0


def test_a_lost_reply_delivers_and_hangs_up(mail: SandboxProcess, unique: Unique) -> None:
    message_id = f"<{unique('op')}@countersign.test>"

    with pytest.raises(smtplib.SMTPServerDisconnected):
        send(mail, message("fault-lost-reply@example.com", message_id))

    assert deliveries(mail, message_id) == 1


def test_a_crash_delivers_then_the_server_comes_back(mail: SandboxProcess, unique: Unique) -> None:
    message_id = f"<{unique('op')}@countersign.test>"
    msg = message("fault-crash@example.com", message_id)
    before = client.wait_healthy(mail.base_url)

    with pytest.raises(smtplib.SMTPServerDisconnected):
        send(mail, msg)

    after = client.wait_healthy(mail.base_url)
    assert after["pid"] != before["pid"]
    assert deliveries(mail, message_id) == 1
    assert query(mail, message_id).status_code == 200
    send(mail, msg)  # the crash was for the first attempt only, even across the restart
    assert deliveries(mail, message_id) == 2


def test_opaque_delivers_and_every_query_fails(mail: SandboxProcess, unique: Unique) -> None:
    message_id = f"<{unique('op')}@countersign.test>"

    with pytest.raises(smtplib.SMTPServerDisconnected):
        send(mail, message("fault-opaque@example.com", message_id))

    assert deliveries(mail, message_id) == 1
    assert query(mail, message_id).status_code == 500
    assert query(mail, message_id.strip("<>")).status_code == 500


def test_a_service_fault_strikes_smtp_writes(mail: SandboxProcess, unique: Unique) -> None:
    message_id = f"<{unique('op')}@countersign.test>"
    client.set_fault(mail.base_url, "5xx-before-commit", count=1)
    try:
        with pytest.raises(smtplib.SMTPDataError):
            send(mail, message("bob@example.com", message_id))
        send(mail, message("bob@example.com", message_id))
    finally:
        client.clear_fault(mail.base_url)

    assert deliveries(mail, message_id) == 1
