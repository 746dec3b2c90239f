"""A PostgreSQL wire-protocol proxy that can cut connections mid-commit (chaos scenario 6).

    python -m chaos.pgproxy --upstream 127.0.0.1:5432

The chaos stack points its workers (and its API server) at this proxy instead of the database,
so the harness can do to their connections what a network fault or a server restart does,
without touching the shared PostgreSQL server. It reads each client message whole (type byte,
int32 length), keeps the text of the connection's open transaction (simple `Query` and
extended `Parse` texts, plus `Bind` parameter values), and resets it when the server reports
ReadyForQuery "idle". When a client sends COMMIT (as a simple query or through Parse — psycopg 3
sends it through the extended protocol) and the transaction's text contains every string of an
armed rule, the rule fires. A statement sent outside any transaction block (autocommit) is its
own transaction, committed at its Sync (or with its simple Query): that message is then its
COMMIT.

- `before`: the COMMIT is not forwarded and the connection is closed; the server sees EOF inside
  a transaction and rolls back. Nothing committed; the client gets an error.
- `reply`: the COMMIT is forwarded, the server's answer is read up to ReadyForQuery and thrown
  away, and the connection is closed. The transaction committed; the client gets an error and
  cannot know. This is the case that matters: an acknowledgement lost after the commit.

Then, as a restarting server would, it cuts every other open connection (`sever_all`) and, for
`refuse_seconds`, answers each new connection with FATAL 57P03 "the database system is starting
up". SSL is declined (the proxy must read the messages), and the harness talks to it over a
control port: one JSON object per line, `{"cmd": "arm", "rule": {...}}`, `{"cmd": "fired"}`,
`{"cmd": "reset"}`. On start it prints `pgproxy ready port=P control=C`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import sys
import time
from dataclasses import dataclass, field

SSL_REQUEST, GSSENC_REQUEST, CANCEL_REQUEST = 80877103, 80877104, 80877102
MODES = ("before", "reply")


@dataclass
class Rule:
    id: str
    all: list[str]
    mode: str = "reply"
    sever_all: bool = True
    refuse_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        if not self.all:
            raise ValueError("a rule needs at least one string to match")


@dataclass(eq=False)  # hashed by identity: kept in a set
class Conn:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    tx_text: list[str] = field(default_factory=list)
    # The server's last ReadyForQuery said "in a transaction block" (or a failed one).
    in_block: bool = False
    # Set once a rule fired on this connection's COMMIT: the server's answer is swallowed.
    swallow_reply: asyncio.Event = field(default_factory=asyncio.Event)
    reply_seen: asyncio.Event = field(default_factory=asyncio.Event)

    def close(self) -> None:
        for writer in (self.client, self.server):
            try:
                writer.transport.abort()  # RST, not a polite FIN: as when a server dies
            except Exception:  # noqa: BLE001 - already gone
                pass


class Proxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.rules: list[Rule] = []
        self.fired: list[dict] = []
        self.conns: set[Conn] = set()
        self.refuse_until = 0.0
        self.connections_seen = 0
        self.commits_seen = 0

    # -- clients -------------------------------------------------------------------------------

    async def handle_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections_seen += 1
        try:
            startup = await self._startup(reader, writer)
            if startup is None:
                return
            if time.monotonic() < self.refuse_until:
                writer.write(_fatal("57P03", "the database system is starting up (chaos proxy)"))
                await writer.drain()
                writer.close()
                return
            server_reader, server_writer = await asyncio.open_connection(*self.upstream)
        except (OSError, asyncio.IncompleteReadError):
            writer.transport.abort()
            return
        server_writer.write(startup)
        conn = Conn(client=writer, server=server_writer)
        self.conns.add(conn)
        code = struct.unpack("!I", startup[4:8])[0]
        try:
            if code == CANCEL_REQUEST:
                await asyncio.gather(_pipe(reader, server_writer), _pipe(server_reader, writer), return_exceptions=True)
            else:
                await asyncio.gather(self._client_to_server(conn, reader), self._server_to_client(conn, server_reader),
                                     return_exceptions=True)
        except (OSError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            conn.close()
            self.conns.discard(conn)

    async def _startup(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes | None:
        """The untyped first message; SSL and GSS encryption requests are declined here."""
        while True:
            head = await reader.readexactly(8)
            length, code = struct.unpack("!II", head)
            rest = await reader.readexactly(length - 8)
            if code in (SSL_REQUEST, GSSENC_REQUEST):
                writer.write(b"N")
                await writer.drain()
                continue
            return head + rest

    async def _client_to_server(self, conn: Conn, reader: asyncio.StreamReader) -> None:
        pending: Rule | None = None  # a rule fired on this transaction's COMMIT (reply mode)
        while True:
            kind, body = await _read_message(reader)
            if kind == b"X":  # Terminate
                conn.server.write(kind + struct.pack("!I", len(body) + 4) + body)
                await conn.server.drain()
                return
            text = _text_of(kind, body)
            if text is not None:
                conn.tx_text.append(text)
            if (text is not None and _is_commit(text)) or self._implicit_commit(conn, kind):
                self.commits_seen += 1
                pending = self._match(conn)
                if pending is not None and pending.mode == "before":
                    self._fire(pending, conn)
                    return
                if pending is not None:
                    conn.swallow_reply.set()
            conn.server.write(kind + struct.pack("!I", len(body) + 4) + body)
            await conn.server.drain()
            # The COMMIT went out whole (a Query, or the Sync closing Parse/Bind/Execute): wait
            # for the server's answer, throw it away, and cut.
            if pending is not None and kind in (b"Q", b"S"):
                try:
                    await asyncio.wait_for(conn.reply_seen.wait(), timeout=10)
                finally:
                    self._fire(pending, conn)
                return

    async def _server_to_client(self, conn: Conn, reader: asyncio.StreamReader) -> None:
        while True:
            kind, body = await _read_message(reader)
            if conn.swallow_reply.is_set():
                if kind == b"Z":
                    conn.reply_seen.set()
                    return
                continue
            conn.client.write(kind + struct.pack("!I", len(body) + 4) + body)
            await conn.client.drain()
            if kind == b"Z":
                conn.in_block = body[:1] != b"I"
                if not conn.in_block:  # idle: the transaction (if any) is over
                    conn.tx_text.clear()

    @staticmethod
    def _implicit_commit(conn: Conn, kind: bytes) -> bool:
        """A Sync (or simple Query) closing statements sent outside a transaction block: the
        server commits them with it, unless they open a block (BEGIN)."""
        if kind not in (b"S", b"Q") or conn.in_block or not conn.tx_text:
            return False
        return not any(_is_begin(text) for text in conn.tx_text)

    def _match(self, conn: Conn) -> Rule | None:
        if not self.rules:
            return None
        text = "\n".join(conn.tx_text)
        for rule in self.rules:
            if all(needle in text for needle in rule.all):
                self.rules.remove(rule)
                return rule
        return None

    def _fire(self, rule: Rule, conn: Conn) -> None:
        others = [other for other in self.conns if other is not conn] if rule.sever_all else []
        conn.close()
        for other in others:
            other.close()
        if rule.refuse_seconds:
            self.refuse_until = time.monotonic() + rule.refuse_seconds
        self.fired.append({"id": rule.id, "mode": rule.mode, "severed": 1 + len(others), "at": time.time()})

    # -- control -------------------------------------------------------------------------------

    async def handle_control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                try:
                    answer = self.command(json.loads(line))
                except (ValueError, TypeError, KeyError) as exc:
                    answer = {"ok": False, "error": str(exc)}
                writer.write(json.dumps(answer).encode() + b"\n")
                await writer.drain()
        finally:
            writer.close()

    def command(self, message: dict) -> dict:
        cmd = message["cmd"]
        if cmd == "arm":
            self.rules.append(Rule(**message["rule"]))
            return {"ok": True}
        if cmd == "fired":
            return {"ok": True, "fired": self.fired, "armed": [rule.id for rule in self.rules],
                    "open": len(self.conns), "connections": self.connections_seen, "commits": self.commits_seen}
        if cmd == "reset":
            self.rules.clear()
            self.refuse_until = 0.0
            return {"ok": True}
        raise ValueError(f"unknown command {cmd!r}")


async def _read_message(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readexactly(5)
    length = struct.unpack("!I", head[1:])[0]
    return head[:1], await reader.readexactly(length - 4)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()


def _text_of(kind: bytes, body: bytes) -> str | None:
    """The SQL (or parameter values) a client message carries, for matching."""
    if kind == b"Q":
        return body.rstrip(b"\0").decode("utf-8", "replace")
    if kind == b"P":  # name\0 query\0 int16 n, int32 oids
        _, query, _ = body.split(b"\0", 2)
        return query.decode("utf-8", "replace")
    if kind == b"B":  # the parameter values, best effort (text format)
        return body.decode("utf-8", "replace")
    return None


def _is_begin(text: str) -> bool:
    return text.strip().rstrip(";").strip().upper().startswith(("BEGIN", "START TRANSACTION"))


def _is_commit(text: str) -> bool:
    return text.strip().rstrip(";").strip().upper() in ("COMMIT", "END", "COMMIT TRANSACTION", "COMMIT WORK")


def _fatal(sqlstate: str, message: str) -> bytes:
    fields = b"SFATAL\0VFATAL\0C" + sqlstate.encode() + b"\0M" + message.encode() + b"\0\0"
    return b"E" + struct.pack("!I", len(fields) + 4) + fields


# -- the harness's side --------------------------------------------------------------------------

class ProxyControl:
    """The harness's client of the control port."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.address = (host, port)

    def send(self, message: dict) -> dict:
        with socket.create_connection(self.address, timeout=10) as sock:
            sock.sendall(json.dumps(message).encode() + b"\n")
            answer = json.loads(sock.makefile().readline())
        if not answer.get("ok"):
            raise RuntimeError(f"pgproxy refused {message}: {answer.get('error')}")
        return answer

    def arm(self, rule_id: str, needles: list[str], *, mode: str = "reply", sever_all: bool = True,
            refuse_seconds: float = 0.0) -> None:
        self.send({"cmd": "arm", "rule": {"id": rule_id, "all": needles, "mode": mode, "sever_all": sever_all,
                                          "refuse_seconds": refuse_seconds}})

    def fired(self, rule_id: str) -> dict | None:
        return next((fired for fired in self.send({"cmd": "fired"})["fired"] if fired["id"] == rule_id), None)

    def status(self) -> dict:
        return self.send({"cmd": "fired"})

    def reset(self) -> None:
        self.send({"cmd": "reset"})


async def _main(upstream: str, port: int, control_port: int) -> None:
    host, _, upstream_port = upstream.rpartition(":")
    proxy = Proxy(host or "127.0.0.1", int(upstream_port))
    server = await asyncio.start_server(proxy.handle_client, "127.0.0.1", port)
    control = await asyncio.start_server(proxy.handle_control, "127.0.0.1", control_port)
    bound = server.sockets[0].getsockname()[1]
    control_bound = control.sockets[0].getsockname()[1]
    print(f"pgproxy ready port={bound} control={control_bound}", flush=True)
    async with server, control:
        await asyncio.gather(server.serve_forever(), control.serve_forever())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="host:port of PostgreSQL")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--control-port", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        asyncio.run(_main(args.upstream, args.port, args.control_port))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
