"""The HTTP side shared by the sandbox providers: a tiny router over the stdlib server.

Service apps return a ``Reply`` or ``DROP``; ``DROP`` closes the connection without a byte of
response, which is how a "lost reply" looks to a client. Hangs and crashes happen inside the app,
on the request's own thread, so they behave like a slow or dying real server.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

from sandbox.faults import TARGETS, normalize_fault_name
from sandbox.store import Store


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


class _Drop:
    def __repr__(self) -> str:
        return "DROP"


DROP: Final = _Drop()
Outcome = Reply | _Drop


@dataclass
class Request:
    method: str
    segments: list[str]  # percent-decoded one by one, so an encoded "/" stays inside its segment
    query: dict[str, list[str]]
    headers: Message
    body: bytes

    def query_one(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None


def error(status: int, code: str, message: str, details: Any = None, **headers: str) -> Reply:
    body = {"error": {"code": code, "message": message, "details": details or {}}}
    return Reply(status, body, dict(headers))


def crash(reason: str) -> None:
    """Die the way a real server dies: no cleanup, no reply, no flush of anything but stderr."""
    sys.stderr.write(f"sandbox: crashing on purpose ({reason}), pid {os.getpid()}\n")
    sys.stderr.flush()
    os._exit(1)


class SandboxApp:
    """Routes common to every provider; subclasses add theirs in ``route``."""

    service = "sandbox"

    def __init__(self, store: Store, *, hang_seconds: float, generation: int = 0) -> None:
        self.store = store
        self.hang_seconds = hang_seconds
        self.generation = generation

    # Payments keys are compared as sent; mail overrides this to ignore angle brackets.
    def normalize_key(self, key: str) -> str:
        return key

    def hang(self) -> None:
        time.sleep(self.hang_seconds)

    def handle(self, req: Request) -> Outcome:
        seg, method = req.segments, req.method
        if seg == ["_health"] and method == "GET":
            return Reply(
                200,
                {
                    "ok": True,
                    "service": self.service,
                    "pid": os.getpid(),
                    "supervisor_pid": os.getppid(),
                    "generation": self.generation,
                },
            )
        if seg == ["effects"] and method == "GET":
            key = req.query_one("key")
            match_key = self.normalize_key(key) if key is not None else None
            return Reply(200, [e.as_json() for e in self.store.effects(match_key=match_key)])
        if seg == ["_control", "reset"] and method == "POST":
            self.store.reset()
            return Reply(200, {"ok": True})
        if seg == ["_control", "faults"]:
            if method == "GET":
                return Reply(200, self.store.control().as_json())
            if method == "POST":
                return self._set_faults(req)

        latency_ms = self.store.control().latency_ms
        if latency_ms:
            time.sleep(latency_ms / 1000)
        if method == "GET":
            fault = self.store.take_service_fault("reads")
            if fault:
                outcome = self._read_fault(fault)
                if outcome is not None:
                    return outcome
        outcome = self.route(req)
        if outcome is None:
            return error(404, "not_found", f"no route for {method} /{'/'.join(seg)}")
        return outcome

    def route(self, req: Request) -> Outcome | None:
        return None

    def _read_fault(self, fault: str) -> Outcome | None:
        """Service-wide faults on queries: there is nothing to commit, so only the shape remains."""
        if fault == "429":
            return error(429, "rate_limited", "slow down", **{"Retry-After": "1"})
        if fault in ("5xx-before-commit", "5xx-after-commit", "opaque"):
            return error(503, "unavailable", f"injected fault-{fault}")
        if fault == "timeout-before-commit":
            self.hang()
            return DROP
        if fault == "timeout-after-commit":
            self.hang()
            return None
        if fault == "lost-reply":
            return DROP
        if fault == "crash":
            crash("service-wide fault-crash on a read")
        return None

    def _set_faults(self, req: Request) -> Reply:
        try:
            body = json.loads(req.body or b"{}")
        except ValueError:
            return error(400, "invalid_json", "body is not JSON")
        if not isinstance(body, dict):
            return error(400, "invalid_request", "body must be a JSON object")
        if "fault" in body:
            fault, count, target = body["fault"], body.get("count"), body.get("target", "writes")
            if target not in TARGETS:
                return error(400, "invalid_request", f"target must be one of {TARGETS}")
            if count is not None and (
                isinstance(count, bool) or not isinstance(count, int) or count < 1
            ):
                return error(400, "invalid_request", "count must be a positive integer or absent")
            if fault is None:
                self.store.set_fault(None, count=None, target="writes")
            elif isinstance(fault, str):
                try:
                    self.store.set_fault(normalize_fault_name(fault), count=count, target=target)
                except ValueError as exc:
                    return error(400, "unknown_fault", str(exc))
            else:
                return error(400, "invalid_request", "fault must be a string or null")
        if "latency_ms" in body:
            latency = body["latency_ms"]
            if isinstance(latency, bool) or not isinstance(latency, int) or latency < 0:
                return error(400, "invalid_request", "latency_ms must be a non-negative integer")
            self.store.set_latency(latency)
        return Reply(200, self.store.control().as_json())


class SandboxHTTPServer(ThreadingHTTPServer):
    # Hung requests must not keep the process alive or block a restart.
    daemon_threads = True

    def __init__(self, sock: socket.socket, app: SandboxApp, *, verbose: bool = False) -> None:
        # The supervisor owns the listening socket (so a crash restart never refuses a
        # connection); adopt it instead of binding a new one.
        super().__init__(sock.getsockname()[:2], _Handler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock
        self.server_name, self.server_port = sock.getsockname()[:2]
        self.app = app
        self.verbose = verbose

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            return  # the client gave up first: expected with timeouts and lost replies
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server: SandboxHTTPServer
    # One request per connection: no keep-alive state to confuse a client across a crash.
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(format, *args)

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        req = Request(
            method=method,
            segments=[unquote(s) for s in url.path.split("/")[1:] if s != ""],
            query=parse_qs(url.query),
            headers=self.headers,
            body=body,
        )
        try:
            outcome = self.server.app.handle(req)
        except Exception as exc:  # a bug in the sandbox must still answer, loudly
            self.log_error("sandbox error: %r", exc)
            outcome = error(500, "sandbox_bug", repr(exc))
        if isinstance(outcome, _Drop):
            self.close_connection = True
            return
        payload = json.dumps(outcome.body).encode()
        try:
            self.send_response(outcome.status)
            for name, value in outcome.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out while we hung: the reply is lost, as intended
