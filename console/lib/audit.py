"""The event log's hash chains: the bytes each row's hashes cover and the check of the chains
(`manage.py audit_verify`); docs/security.md documents them for an auditor.

One chain per tenant and one for events with no tenant. The writer computes `content_hash`
(`event_row`, in Python: every field it writes); the row is then sealed: given `chain_seq` (1, 2,
… in its chain), `prev_hash` (the `hash` of the row sealed before it, "" for the first) and
`hash` (SHA-256 of `link_bytes`), from the chain's head row (`EventChainHead`), which the sealing
locks and moves. On PostgreSQL the sealer (`seal_pending`) does it after the writer's commit, a
batch of rows per transaction: sealing at each writer's commit held the head's lock through the
commit's WAL flush, so a tenant's writing commits went one at a time. Rows are therefore chained
in the order the sealer finds them committed, not id order. SQLite serializes writers; its
trigger seals each row at insert.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Q, QuerySet

from console.models import Event, EventChainHead


def chain_of(tenant_id: int | None) -> str:
    return "none" if tenant_id is None else f"tenant:{tenant_id}"


# Sorted keys, no spaces, UTF-8: the same text for a value read back from jsonb (which reorders
# keys) as for the value written. One encoder for every hash (`json.dumps` with these options
# builds one per call; every event is hashed as it is written).
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _json(value: Any) -> str:
    return _ENCODER.encode(value)


def content_bytes(row: Event) -> bytes:
    """What `content_hash` covers: every field the application writes, as one JSON array."""
    # YYYY-MM-DDTHH:MM:SS.ffffffZ, always six digits (isoformat: "+00:00" replaced).
    created_at = row.created_at.astimezone(UTC).isoformat(timespec="microseconds")[:-6] + "Z"
    return _json([
        "countersign-event-v1", row.tenant_id, row.entity, str(row.entity_id), row.kind, row.from_status,
        row.to_status, row.actor, row.reason, row.evidence, created_at,
    ]).encode()


def content_hash(row: Event) -> str:
    return hashlib.sha256(content_bytes(row)).hexdigest()


def link_bytes(*, chain: str, seq: int, event_id: int, prev_hash: str, content: str) -> bytes:
    """What `hash` covers: the row's place (chain, sequence number, id), the hash of the row
    before it and its own content hash. The database triggers build the same text."""
    return f"countersign-link-v1|{chain}|{seq}|{event_id}|{prev_hash}|{content}".encode()


def link_hash(row: Event) -> str:
    return hashlib.sha256(link_bytes(chain=chain_of(row.tenant_id), seq=row.chain_seq, event_id=row.id,
                                     prev_hash=row.prev_hash, content=row.content_hash)).hexdigest()


@dataclass(frozen=True)
class Break:
    chain: str
    event_id: int | None
    what: str  # "changed", "removed", "inserted", "moved" (re-ordered or renumbered)
    detail: str

    def __str__(self) -> str:
        where = f"event #{self.event_id}" if self.event_id is not None else "chain end"
        return f"{self.chain}: {self.what} at {where}: {self.detail}"


VERIFY_CHUNK = 2000


def _pages(events: QuerySet[Event], chunk_size: int) -> Iterator[Event]:
    """The chain's rows in (chain_seq, id) order, `chunk_size` at a time, each page a query of
    its own that starts after the last row of the one before (keyset pagination): memory stays
    flat however long the chain, and no cursor stays open between pages. (A server-side cursor
    opened outside a transaction is WITH HOLD, which PostgreSQL materializes whole.)"""
    after = events  # the first page from the very first row, whatever its number
    while True:
        page = list(after.order_by("chain_seq", "id")[:chunk_size])
        yield from page
        if len(page) < chunk_size:
            return
        last = page[-1]
        # (chain_seq, id) > last's, written so that both databases range-scan the chain's index
        # on chain_seq (the OR alone would make SQLite scan the whole chain for every page).
        after = events.filter(chain_seq__gte=last.chain_seq).filter(
            Q(chain_seq__gt=last.chain_seq) | Q(id__gt=last.id))


def verify_chain(tenant_id: int | None, *, chunk_size: int = VERIFY_CHUNK) -> Break | None:
    """The first broken link of one chain, or None when every row hashes to what it says, each
    names the hash of the one before, the sequence has no gap or repeat and the head agrees.
    Reads the chain `chunk_size` rows at a time. Rows not sealed yet are not in the chain yet:
    `audit_verify` seals them first."""
    chain = chain_of(tenant_id)
    events = Event.objects.filter(tenant_id=tenant_id) if tenant_id is not None else Event.objects.filter(
        tenant__isnull=True)
    expected_seq, prev = 1, ""
    for row in _pages(events.filter(chain_seq__isnull=False), chunk_size):
        if row.chain_seq < expected_seq:
            return Break(chain, row.id, "inserted", f"a second row numbered {row.chain_seq}")
        if row.chain_seq > expected_seq:
            return Break(chain, row.id, "removed",
                         f"rows {expected_seq}..{row.chain_seq - 1} are missing before this one")
        if row.content_hash != content_hash(row):
            return Break(chain, row.id, "changed", "its fields do not hash to its content hash")
        if row.hash != link_hash(row):
            # The content is whole but not where it was sealed: another id or place.
            return Break(chain, row.id, "moved", "its id or place in the chain is not the one it was sealed at")
        if row.prev_hash != prev:
            return Break(chain, row.id, "inserted",
                         f"it names {row.prev_hash[:12] or '(none)'} as the row before, which hashes to "
                         f"{prev[:12] or '(none)'}")
        prev = row.hash
        expected_seq += 1
    head = EventChainHead.objects.filter(chain=chain).first()
    last_seq = expected_seq - 1
    if head is not None and (head.seq, head.hash) != (last_seq, prev):
        return Break(chain, None, "removed", f"the head says {head.seq} rows, the table holds {last_seq}")
    return None


def chains(tenant_ids: Iterable[int | None] | None = None) -> list[int | None]:
    if tenant_ids is not None:
        return list(tenant_ids)
    found = set(Event.objects.values_list("tenant_id", flat=True).distinct())
    found |= {None if h == "none" else int(h.split(":", 1)[1])
              for h in EventChainHead.objects.values_list("chain", flat=True)}
    return sorted(found, key=lambda t: (t is not None, t or 0))


# The sealer (PostgreSQL). Only one seals at a time: this key's transaction-level advisory lock.
SEAL_LOCK = 0x5EA1
SEAL_BATCH = 5000


def seal_pending(*, batch: int = SEAL_BATCH) -> int:
    """Links every committed row not sealed yet into its chain; returns how many. On PostgreSQL
    the writers leave their rows unsealed, and this runs after them (`console.seal_events`, every
    EVENT_SEAL_SECONDS, and `audit_verify` first): one transaction per `batch` rows, the heads
    moved once per batch, so no writer's commit waits for another's. On SQLite the insert trigger
    seals every row the application writes (its writers are serialized anyway); only a row
    written around the trigger is left for this."""
    postgres = connection.vendor == "postgresql"
    sealed = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            if postgres:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [SEAL_LOCK])
            # Read after the lock: what a sealer before this one sealed is not read again.
            cursor.execute("SELECT id, tenant_id, content_hash FROM ledger_event WHERE chain_seq IS NULL "
                           "ORDER BY id LIMIT %s", [batch])
            rows = cursor.fetchall()
            if not rows:
                return sealed
            _seal(cursor, rows, postgres=postgres)
        sealed += len(rows)
        if len(rows) < batch:
            return sealed


def _seal(cursor, rows: list[tuple[int, int | None, str]], *, postgres: bool) -> None:
    """Chains `rows` (id order) after their chains' heads: the heads locked in the chains' order,
    the rows updated from one VALUES list on PostgreSQL (the append-only trigger lets this one
    update through: the chain columns of a row not sealed yet), one by one on SQLite."""
    by_chain: dict[str, list[tuple[int, str]]] = {}
    for event_id, tenant_id, content in rows:
        by_chain.setdefault(chain_of(tenant_id), []).append((event_id, content))
    links: list[tuple[int, int, str, str]] = []  # (id, chain_seq, prev_hash, hash)
    for chain in sorted(by_chain):
        cursor.execute("INSERT INTO console_eventchainhead (chain, seq, hash) VALUES (%s, 0, '') "
                       "ON CONFLICT (chain) DO UPDATE SET seq = console_eventchainhead.seq RETURNING seq, hash",
                       [chain])
        seq, prev = cursor.fetchone()
        for event_id, content in by_chain[chain]:
            seq += 1
            link = hashlib.sha256(link_bytes(chain=chain, seq=seq, event_id=event_id, prev_hash=prev,
                                             content=content)).hexdigest()
            links.append((event_id, seq, prev, link))
            prev = link
        cursor.execute("UPDATE console_eventchainhead SET seq = %s, hash = %s WHERE chain = %s", [seq, prev, chain])
    if not postgres:
        cursor.executemany("UPDATE ledger_event SET chain_seq = %s, prev_hash = %s, hash = %s WHERE id = %s",
                           [(seq, prev, link, event_id) for event_id, seq, prev, link in links])
        return
    values = ", ".join(["(%s::bigint, %s::bigint, %s, %s)"] * len(links))
    cursor.execute(f"UPDATE ledger_event e SET chain_seq = v.seq, prev_hash = v.prev, hash = v.link "
                   f"FROM (VALUES {values}) AS v(id, seq, prev, link) WHERE e.id = v.id",
                   [part for link in links for part in link])


# Signed approval decisions: a receipt an auditor can check offline with the exported key.

def decision_bytes(*, call_id: str, arguments_hash: str, state_version: int, approver: str, decision: str,
                   at: datetime) -> bytes:
    """What a decision's signature covers, as one JSON array (docs/security.md)."""
    return _json([
        "countersign-decision-v1", call_id, arguments_hash, int(state_version), approver, decision,
        at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    ]).encode()


def sign_decision(**fields: Any) -> str:
    """HMAC-SHA256 (hex) of `decision_bytes` under settings.AUDIT_SIGNING_KEY."""
    return hmac.new(settings.AUDIT_SIGNING_KEY.encode(), decision_bytes(**fields), hashlib.sha256).hexdigest()


def decision_signature_holds(signature: str, **fields: Any) -> bool:
    return bool(signature) and hmac.compare_digest(signature, sign_decision(**fields))


def forged_decisions() -> list[str]:
    """Every approval decision whose receipt does not hold for its row and its request, named.
    (The approvals app's model by name: this floor imports no app.)"""
    decision_model = apps.get_model("approvals", "ApprovalDecision")
    user_field = get_user_model().USERNAME_FIELD
    found = []
    for decision in decision_model.objects.select_related("request", "reviewer").order_by("pk").iterator(
            chunk_size=500):
        request = decision.request
        if not decision_signature_holds(
                decision.signature, call_id=request.call_id, arguments_hash=decision.arguments_hash,
                state_version=request.state_version, approver=f"user:{getattr(decision.reviewer, user_field)}",
                decision=decision.verdict, at=decision.created_at) or decision.arguments_hash != request.arguments_hash:
            found.append(f"approval {request.pk}: decision {decision.pk} ({decision.verdict}) does not match its "
                         "signed receipt")
    return found
