"""mail.send over SMTP; the Message-ID carries the idempotency key, and the provider's HTTP side
answers queries by Message-ID. SMTP does not deduplicate: a blind resend is a second email, so
the dispatcher queries before any retry of this tool."""

from __future__ import annotations

import smtplib
from email.message import EmailMessage
from email.utils import formatdate
from typing import Any
from urllib.parse import quote

import httpx
from django.conf import settings

from ledger.adapters.base import (
    ABSENT,
    ERROR,
    FOUND,
    PROCESSING,
    Outcome,
    QueryAnswer,
    known_failure,
    known_success,
    not_sent,
    unknown,
)
from ledger.adapters.http import client

SENDER = "agents@countersign.local"


def message_id_for(key: str) -> str:
    return f"<{key}@countersign.local>"


def _smtp_reply(exc: smtplib.SMTPResponseException) -> dict[str, Any]:
    message = exc.smtp_error.decode(errors="replace") if isinstance(exc.smtp_error, bytes) else str(exc.smtp_error)
    return {"smtp_code": exc.smtp_code, "smtp_message": message}


class MailAdapter:
    name = "mail.send"
    can_query = True

    def build(self, arguments: dict[str, Any], *, key: str) -> EmailMessage:
        message = EmailMessage()
        message["From"] = SENDER
        message["To"] = ", ".join(arguments["to"])
        message["Subject"] = arguments["subject"]
        message["Date"] = formatdate(usegmt=True)
        message["Message-ID"] = message_id_for(key)
        message.set_content(arguments["body"])
        return message

    def execute(self, arguments: dict[str, Any], *, key: str, timeout: float) -> Outcome:
        message = self.build(arguments, key=key)
        sent_data = False
        try:
            with smtplib.SMTP("127.0.0.1", settings.SANDBOX_MAIL_SMTP_PORT, timeout=timeout) as smtp:
                smtp.ehlo()
                # Until DATA's final dot, the server has accepted nothing: failures before it
                # are "not sent"; after it, only the reply can tell.
                smtp.mail(SENDER)
                for rcpt in arguments["to"]:
                    code, reply = smtp.rcpt(rcpt)
                    if code >= 500:
                        return known_failure("validation", code=str(code), provider_status=str(code),
                                             raw={"smtp_code": code, "smtp_message": reply.decode(errors="replace")})
                    if code >= 400:
                        return not_sent("unavailable", transport="ok", code=str(code), provider_status=str(code),
                                        raw={"smtp_code": code, "smtp_message": reply.decode(errors="replace")})
                sent_data = True
                code, reply = smtp.data(message.as_bytes())
                if not 200 <= code < 300:
                    # smtplib raises only for the reply to the DATA command itself; the reply
                    # after the final dot is returned, and a 451 there is not a delivery.
                    raise smtplib.SMTPDataError(code, reply)
        except ConnectionRefusedError as exc:
            return not_sent("connect", transport="connect_error", code="ECONNREFUSED", raw={"error": str(exc)})
        except smtplib.SMTPDataError as exc:
            raw = _smtp_reply(exc)
            if exc.smtp_code >= 500:
                return known_failure("validation", code=str(exc.smtp_code), raw=raw)
            # 4xx to DATA: the server promises it kept nothing.
            return not_sent("unavailable", transport="ok", code=str(exc.smtp_code), raw=raw,
                            provider_status=str(exc.smtp_code))
        except smtplib.SMTPRecipientsRefused as exc:
            return known_failure("validation", code="550", raw={"refused": {k: list(v) for k, v in exc.recipients.items()}})
        except TimeoutError as exc:
            if not sent_data:
                return not_sent("connect", transport="timeout", code="timeout_before_data", raw={"error": str(exc)})
            return unknown("timeout", transport="timeout", code="timeout", raw={"error": str(exc)})
        except (smtplib.SMTPServerDisconnected, ConnectionResetError, OSError) as exc:
            if not sent_data:
                return not_sent("connect", transport="reset", code=type(exc).__name__, raw={"error": str(exc)})
            return unknown("reset", transport="reset", code=type(exc).__name__, raw={"error": str(exc)})
        raw = {"smtp_code": code, "smtp_message": reply.decode(errors="replace")}
        return known_success(receipt={"message_id": message["Message-ID"], "to": list(arguments["to"]),
                                      "provider": "mail"}, code=str(code), raw=raw)

    def query(self, *, key: str, timeout: float) -> QueryAnswer:
        message_id = message_id_for(key)
        url = f"{settings.SANDBOX_MAIL_URL.rstrip('/')}/messages/{quote(message_id, safe='')}"
        try:
            response = client().get(url, timeout=timeout)
        except httpx.HTTPError as exc:
            return QueryAnswer(ERROR, raw={"error": f"{type(exc).__name__}: {exc}"})
        try:
            body = response.json()
        except ValueError:
            body = {}
        raw = {"status": response.status_code, "body": body}
        if response.status_code == 404:
            # Still inside an SMTP session at the provider: it may yet commit.
            return QueryAnswer(PROCESSING if body.get("in_flight") else ABSENT, raw=raw)
        if response.status_code != 200:
            return QueryAnswer(ERROR, raw=raw)
        found = body.get("message") or {}
        return QueryAnswer(FOUND, raw=raw, receipt={"message_id": message_id, "to": found.get("to"),
                                                   "provider": "mail", "via": "query"})

    def preview(self, arguments: dict[str, Any]) -> dict[str, Any] | None:
        return {"kind": "email", "from": SENDER, "to": arguments.get("to"), "subject": arguments.get("subject"),
                "body": arguments.get("body")}
