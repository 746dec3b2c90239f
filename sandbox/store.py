"""Durable state of a sandbox provider, in one SQLite file (WAL).

Every effect is committed here *before* any after-commit fault strikes, so an effect survives the
provider's own crash and tests can count effects from outside. A fresh connection per operation
keeps the store safe to use from the HTTP server's threads and the SMTP event loop at once;
``BEGIN IMMEDIATE`` takes the write lock up front so read-modify-write sequences (attempt
counters, fault budgets) cannot interleave.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sandbox.faults import TARGETS

COMMON_SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,          -- the idempotency key as the caller sent it
    match_key TEXT NOT NULL,    -- the key normalized for look-ups (e.g. Message-ID without <>)
    remote_id TEXT,             -- the provider's own id for the effect, if it has one
    payload TEXT NOT NULL,      -- JSON
    at TEXT NOT NULL            -- ISO 8601, UTC
);
CREATE INDEX IF NOT EXISTS effects_match_key ON effects (match_key);
CREATE INDEX IF NOT EXISTS effects_remote_id ON effects (remote_id);
-- Requests seen per key: "fault the first request only" must survive a crash restart.
CREATE TABLE IF NOT EXISTS attempts (match_key TEXT PRIMARY KEY, count INTEGER NOT NULL);
-- Keys whose every query must fail (fault-opaque).
CREATE TABLE IF NOT EXISTS opaque_keys (match_key TEXT PRIMARY KEY);
-- Service-wide faults set through /_control/faults; durable so a "crash, count 1" fault is
-- consumed before the crash and the restarted server does not crash again.
CREATE TABLE IF NOT EXISTS control (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    fault TEXT,
    remaining INTEGER,
    target TEXT NOT NULL DEFAULT 'writes',
    latency_ms INTEGER NOT NULL DEFAULT 0
);
INSERT OR IGNORE INTO control (id) VALUES (1);
"""


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


@dataclass(frozen=True)
class Effect:
    seq: int
    key: str
    match_key: str
    remote_id: str | None
    payload: dict[str, Any]
    at: str

    def as_json(self) -> dict[str, Any]:
        return {"key": self.key, "payload": self.payload, "at": self.at, "seq": self.seq}


@dataclass(frozen=True)
class Control:
    fault: str | None
    remaining: int | None
    target: str
    latency_ms: int

    def as_json(self) -> dict[str, Any]:
        return {
            "fault": f"fault-{self.fault}" if self.fault else None,
            "remaining": self.remaining,
            "target": self.target,
            "latency_ms": self.latency_ms,
        }


class Store:
    def __init__(self, path: str, extra_schema: str = "") -> None:
        self.path = path
        self._extra_schema = extra_schema

    def init(self) -> None:
        """Create the schema and switch to WAL (a property of the file, so once is enough)."""
        conn = sqlite3.connect(self.path, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(COMMON_SCHEMA + self._extra_schema)
        finally:
            conn.close()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=10.0)
        conn.row_factory = sqlite3.Row
        # FULL: a committed effect must survive whatever fault comes next.
        conn.execute("PRAGMA synchronous=FULL")
        return conn

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        conn = self._connect()
        try:
            yield conn
        finally:
            conn.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            conn.close()

    # -- effects ---------------------------------------------------------------------------

    @staticmethod
    def add_effect(
        conn: sqlite3.Connection,
        *,
        key: str,
        match_key: str,
        payload: dict[str, Any],
        remote_id: str | None = None,
    ) -> Effect:
        at = now_iso()
        cur = conn.execute(
            "INSERT INTO effects (key, match_key, remote_id, payload, at) VALUES (?, ?, ?, ?, ?)",
            (key, match_key, remote_id, json.dumps(payload, sort_keys=True), at),
        )
        seq = cur.lastrowid
        assert seq is not None
        return Effect(seq, key, match_key, remote_id, payload, at)

    def effects(
        self, *, match_key: str | None = None, remote_id: str | None = None
    ) -> list[Effect]:
        sql = "SELECT * FROM effects"
        clauses, params = [], []
        if match_key is not None:
            clauses.append("match_key = ?")
            params.append(match_key)
        if remote_id is not None:
            clauses.append("remote_id = ?")
            params.append(remote_id)
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        with self.read() as conn:
            rows = conn.execute(sql + " ORDER BY seq", params).fetchall()
        return [
            Effect(
                r["seq"],
                r["key"],
                r["match_key"],
                r["remote_id"],
                json.loads(r["payload"]),
                r["at"],
            )
            for r in rows
        ]

    # -- attempts and opaque keys ----------------------------------------------------------

    def record_attempt(self, match_key: str) -> int:
        """Count one more request for this key and return its number (1 = first)."""
        with self.tx() as conn:
            conn.execute(
                "INSERT INTO attempts (match_key, count) VALUES (?, 1) "
                "ON CONFLICT (match_key) DO UPDATE SET count = count + 1",
                (match_key,),
            )
            row = conn.execute(
                "SELECT count FROM attempts WHERE match_key = ?", (match_key,)
            ).fetchone()
        return int(row["count"])

    @staticmethod
    def mark_opaque(conn: sqlite3.Connection, match_key: str) -> None:
        conn.execute("INSERT OR IGNORE INTO opaque_keys (match_key) VALUES (?)", (match_key,))

    def is_opaque(self, match_key: str) -> bool:
        with self.read() as conn:
            row = conn.execute(
                "SELECT 1 FROM opaque_keys WHERE match_key = ?", (match_key,)
            ).fetchone()
        return row is not None

    # -- control ---------------------------------------------------------------------------

    def control(self) -> Control:
        with self.read() as conn:
            row = conn.execute("SELECT * FROM control WHERE id = 1").fetchone()
        return Control(row["fault"], row["remaining"], row["target"], row["latency_ms"])

    def set_fault(self, fault: str | None, *, count: int | None, target: str) -> None:
        assert target in TARGETS
        with self.tx() as conn:
            conn.execute(
                "UPDATE control SET fault = ?, remaining = ?, target = ? WHERE id = 1",
                (fault, count if fault else None, target),
            )

    def set_latency(self, latency_ms: int) -> None:
        with self.tx() as conn:
            conn.execute("UPDATE control SET latency_ms = ? WHERE id = 1", (latency_ms,))

    def take_service_fault(self, kind: str) -> str | None:
        """Consume one unit of the service-wide fault if it applies to this kind of request."""
        assert kind in ("writes", "reads")
        with self.tx() as conn:
            row = conn.execute("SELECT * FROM control WHERE id = 1").fetchone()
            fault, remaining, target = row["fault"], row["remaining"], row["target"]
            if not fault or target not in (kind, "all"):
                return None
            if remaining is not None:
                remaining -= 1
                if remaining <= 0:
                    conn.execute("UPDATE control SET fault = NULL, remaining = NULL WHERE id = 1")
                else:
                    conn.execute("UPDATE control SET remaining = ? WHERE id = 1", (remaining,))
            return str(fault)

    def reset(self) -> None:
        """Forget everything: effects, attempts, stored responses, faults, latency."""
        with self.tx() as conn:
            tables = [
                r["name"]
                for r in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' "
                    "AND name NOT LIKE 'sqlite_%'"
                )
            ]
            for table in tables:
                conn.execute(f'DELETE FROM "{table}"')  # names come from sqlite_master
            conn.execute("INSERT OR IGNORE INTO control (id) VALUES (1)")
            conn.execute("DELETE FROM sqlite_sequence")
