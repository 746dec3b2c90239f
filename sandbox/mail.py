"""Mail sandbox: an SMTP server (aiosmtpd) that records every accepted message, plus an HTTP side.

    python -m sandbox.mail --host 127.0.0.1 --http-port 8002 --smtp-port 8025 --db var/mail.sqlite3

Mail does not deduplicate: every accepted DATA is one effect, so a blind resend shows up as a
duplicate. The ``Message-ID`` header is the key (compared with or without angle brackets).
Magic fault values are read from any envelope recipient's local part; ``reject`` in a local part
refuses that recipient with ``550 5.1.1``.

HTTP: ``GET /messages/<message_id>`` (URL-encoded) → 200 / 404 / 500 (opaque), plus the common
``/effects``, ``/_health`` and ``/_control/...``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import threading
import traceback
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser
from functools import partial
from typing import Any

from aiosmtpd.smtp import SMTP, Envelope, Session

from sandbox.faults import MagicFault, magic_fault_for_attempt, parse_magic
from sandbox.store import Store
from sandbox.supervisor import add_common_arguments, bind, supervise
from sandbox.web import Outcome, Reply, Request, SandboxApp, SandboxHTTPServer, crash, error

HOSTNAME = "mail.sandbox.countersign"

REPLY_OK = "250 2.0.0 OK: queued"
REPLY_RATE_LIMITED = "451 4.7.1 Try again later"
REPLY_TEMPORARY = "451 4.3.0 Temporary failure, try again later"
REPLY_REJECTED = "550 5.1.1 Mailbox unavailable"


def normalize_message_id(value: str) -> str:
    return value.strip().removeprefix("<").removesuffix(">").strip()


def local_part(address: str) -> str:
    return address.rsplit("@", 1)[0].lower()


class MailApp(SandboxApp):
    service = "mail"

    def __init__(self, store: Store, *, hang_seconds: float, generation: int = 0) -> None:
        super().__init__(store, hang_seconds=hang_seconds, generation=generation)
        # Message-IDs whose DATA is being processed. Shared between the SMTP event loop and the
        # HTTP threads, hence the lock; in memory because a crash ends every in-flight DATA.
        # A Counter, not a set: mail does not refuse concurrent DATA for one Message-ID.
        self._in_flight: Counter[str] = Counter()
        self._lock = threading.Lock()

    def normalize_key(self, key: str) -> str:
        return normalize_message_id(key)

    @contextmanager
    def in_flight(self, match_key: str) -> Iterator[None]:
        with self._lock:
            self._in_flight[match_key] += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight[match_key] -= 1
                if self._in_flight[match_key] <= 0:
                    del self._in_flight[match_key]

    def is_in_flight(self, match_key: str) -> bool:
        with self._lock:
            return self._in_flight[match_key] > 0

    def _opaque(self, match_key: str) -> bool:
        return "fault-opaque" in match_key.lower() or self.store.is_opaque(match_key)

    # -- HTTP ------------------------------------------------------------------------------

    def route(self, req: Request) -> Outcome | None:
        seg = req.segments
        if req.method == "GET" and len(seg) == 2 and seg[0] == "messages":
            return self.message(seg[1])
        return None

    def message(self, message_id: str) -> Reply:
        match_key = normalize_message_id(message_id)
        if self._opaque(match_key):
            return error(500, "internal_error", "cannot tell (fault-opaque)")
        effects = self.store.effects(match_key=match_key)
        if not effects:
            return Reply(404, {"found": False, "in_flight": self.is_in_flight(match_key)})
        first = effects[0]
        return Reply(
            200,
            {
                "found": True,
                "message": {**first.payload, "at": first.at},
                "deliveries": len(effects),
            },
        )


class MailHandler:
    """aiosmtpd hooks. Recipients are checked at RCPT; faults and the commit happen at DATA."""

    def __init__(self, app: MailApp) -> None:
        self.app = app

    async def handle_RCPT(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        rcpt_options: list[str],
    ) -> str:
        if "reject" in local_part(address):
            return REPLY_REJECTED
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(rcpt_options)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        # Shielded: a real server finishes (or hangs on) a DATA even when the client has gone,
        # whereas aiosmtpd cancels the handler as soon as the client disconnects.
        return await asyncio.shield(self._deliver(server, envelope))

    async def _deliver(self, server: SMTP, envelope: Envelope) -> str:
        try:
            return await self._deliver_unguarded(server, envelope)
        except Exception as exc:  # a shielded task's exception would otherwise be lost
            sys.stderr.write(f"sandbox mail: error in DATA: {exc!r}\n")
            return REPLY_TEMPORARY

    async def _deliver_unguarded(self, server: SMTP, envelope: Envelope) -> str:
        app = self.app
        latency_ms = app.store.control().latency_ms
        if latency_ms:
            await asyncio.sleep(latency_ms / 1000)

        raw = envelope.original_content or b""
        if isinstance(raw, str):
            raw = raw.encode("utf-8", "surrogateescape")
        message: EmailMessage = BytesParser(policy=policy.default).parsebytes(raw)  # type: ignore[assignment]
        message_id = str(message.get("Message-ID") or "").strip()
        if not message_id:
            # Real MTAs stamp one; without it there is nothing to reconcile by.
            message_id = f"<{uuid.uuid4().hex}@{HOSTNAME}>"
        match_key = normalize_message_id(message_id)
        recipients = list(envelope.rcpt_tos)
        magic = _first_magic(recipients)

        with app.in_flight(match_key):
            attempt = app.store.record_attempt(match_key)
            fault = magic_fault_for_attempt(magic, attempt) or app.store.take_service_fault(
                "writes"
            )

            if fault == "429":
                return REPLY_RATE_LIMITED
            if fault == "5xx-before-commit":
                return REPLY_TEMPORARY
            if fault == "timeout-before-commit":
                await asyncio.sleep(app.hang_seconds)
                _drop(server)
                return REPLY_TEMPORARY  # never reaches the client

            payload = {
                "to": recipients,
                "from": str(message.get("From") or envelope.mail_from or ""),
                "mail_from": envelope.mail_from,
                "subject": str(message.get("Subject") or ""),
                "body": _text_body(message),
                "message_id": message_id,
            }
            with app.store.tx() as conn:
                app.store.add_effect(conn, key=message_id, match_key=match_key, payload=payload)
                if fault == "opaque":
                    app.store.mark_opaque(conn, match_key)

            if fault == "timeout-after-commit":
                await asyncio.sleep(app.hang_seconds)
            elif fault in ("lost-reply", "opaque"):
                _drop(server)
            elif fault == "5xx-after-commit":
                return REPLY_TEMPORARY
            elif fault == "crash":
                crash(f"fault-crash for Message-ID {message_id!r}")
        return f"{REPLY_OK} as {match_key}"


def _first_magic(recipients: list[str]) -> MagicFault | None:
    for address in recipients:
        magic = parse_magic(local_part(address))
        if magic is not None:
            return magic
    return None


def _drop(server: SMTP) -> None:
    """Close the connection without a reply; aiosmtpd then drops the status we return."""
    transport = server.transport
    if transport is not None:
        transport.abort()


def _text_body(message: EmailMessage) -> str:
    part = message.get_body(preferencelist=("plain", "html"))
    if part is None:
        return ""
    try:
        text = str(part.get_content())
    except (KeyError, LookupError):  # unknown charset: keep what we can
        payload = part.get_payload(decode=True)
        text = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else ""
    return text.replace("\r\n", "\n")  # SMTP's CRLF is transport, not content


async def _serve_smtp(sock: socket.socket, app: MailApp) -> None:
    loop = asyncio.get_running_loop()
    handler = MailHandler(app)
    server = await loop.create_server(
        lambda: SMTP(handler, hostname=HOSTNAME, enable_SMTPUTF8=True, loop=loop),
        sock=sock,
    )
    async with server:
        await server.serve_forever()


def serve(
    http_sock: socket.socket,
    smtp_sock: socket.socket,
    db: str,
    hang_seconds: float,
    verbose: bool,
    generation: int,
) -> None:
    app = MailApp(Store(db), hang_seconds=hang_seconds, generation=generation)
    httpd = SandboxHTTPServer(http_sock, app, verbose=verbose)
    threading.Thread(target=httpd.serve_forever, name="mail-http", daemon=True).start()
    try:
        asyncio.run(_serve_smtp(smtp_sock, app))
    except BaseException:
        traceback.print_exc()
    # The SMTP loop never returns on its own; if it did, die and let the supervisor restart us
    # (a plain return would leave the HTTP thread answering for a server that no longer mails).
    os._exit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox.mail",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common_arguments(parser)
    parser.add_argument("--http-port", type=int, required=True, help="HTTP port (0: any free port)")
    parser.add_argument("--smtp-port", type=int, required=True, help="SMTP port (0: any free port)")
    args = parser.parse_args(argv)

    Store(args.db).init()
    http_sock = bind(args.host, args.http_port)
    smtp_sock = bind(args.host, args.smtp_port)
    ports: dict[str, Any] = {
        "http_port": http_sock.getsockname()[1],
        "smtp_port": smtp_sock.getsockname()[1],
    }
    return supervise(
        service="mail",
        ports=ports,
        serve=partial(serve, http_sock, smtp_sock, args.db, args.hang_seconds, args.verbose),
        parent_pid=args.parent_pid,
    )


if __name__ == "__main__":
    raise SystemExit(main())
