"""The ground floor's records: who is asking (tenants, the roles of people in them, agent
principals with API tokens) and the append-only event log every app writes to."""

from __future__ import annotations

import hashlib
import secrets
import zoneinfo

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone


class RiskTier(models.IntegerChoices):
    L0 = 0, "L0"
    L1 = 1, "L1"
    L2 = 2, "L2"
    L3 = 3, "L3"
    L4 = 4, "L4"


class Tenant(models.Model):
    slug = models.SlugField(unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
    api_rate_per_minute = models.PositiveIntegerField(
        null=True, blank=True, help_text="Requests a minute for all this tenant's agents together (agent API and "
        "OTLP); empty: the API_RATE_PER_TENANT setting; 0: no limit.")
    time_zone = models.CharField(
        max_length=64, default="UTC",
        help_text="An IANA time zone, e.g. Europe/Berlin: where the tenant's day starts and ends (daily budget caps).")

    def __str__(self) -> str:
        return self.slug

    def clean(self) -> None:
        if not valid_timezone(self.time_zone):
            raise ValidationError({"time_zone": f"{self.time_zone!r} is not an IANA time zone."})


def valid_timezone(name: str) -> bool:
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return False
    return True


class Role(models.TextChoices):
    REVIEWER = "reviewer", "Reviewer"
    SUPPORT = "support", "Support"
    ADMIN = "admin", "Admin"


class Membership(models.Model):
    """A person's role in one tenant. A person may hold several roles (one row each)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)
    max_tier = models.PositiveSmallIntegerField(
        choices=RiskTier.choices, null=True, blank=True,
        help_text="Reviewers only: the highest risk tier this person may approve.",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant", "role"], name="membership_unique_role"),
        ]

    def __str__(self) -> str:
        return f"{self.user} {self.role} @ {self.tenant}"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class AgentPrincipal(models.Model):
    """An agent identity in one tenant. Only the SHA-256 of its bearer token is stored."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="agents")
    name = models.CharField(max_length=100)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    token_prefix = models.CharField(max_length=8, editable=False, help_text="First characters, to tell tokens apart.")
    allowed_tools = models.ManyToManyField("approvals.Tool", blank=True, related_name="agents")
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    api_rate_per_minute = models.PositiveIntegerField(
        null=True, blank=True, help_text="Requests a minute for this token (agent API and OTLP); empty: the "
        "API_RATE_PER_TOKEN setting; 0: no limit.")
    # Decision webhooks (ledger.webhooks). The signing secret is held by reference, like a
    # tool's credential: the name of an environment variable (or setting) of the worker whose
    # value is the `whsec_…` secret. The database never holds it.
    webhook_url = models.URLField(
        max_length=500, blank=True, default="",
        help_text="Countersign POSTs call.decided and call.final here, signed per Standard Webhooks. Empty: none.")
    webhook_secret_ref = models.CharField(
        max_length=100, blank=True, default="",
        help_text="Name of the environment variable (or setting) holding the whsec_ signing secret, e.g. "
                  "AGENT_REFUNDS_WEBHOOK_SECRET. Required with a URL.")
    webhook_disabled_at = models.DateTimeField(
        null=True, blank=True,
        help_text="Set when the receiver answered 410 Gone: nothing is sent until this is cleared.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="agent_unique_name_per_tenant"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant}/{self.name}"

    @property
    def ref(self) -> str:
        """How this principal appears in events and intent hashes."""
        return f"agent:{self.tenant.slug}/{self.name}"

    # Django's auth machinery asks these of request.user.
    is_authenticated = True
    is_anonymous = False

    def set_token(self, token: str | None = None) -> str:
        token = token or "cs_" + secrets.token_urlsafe(32)
        self.token_hash = hash_token(token)
        self.token_prefix = token[:8]
        return token


class EventChainHead(models.Model):
    """The last link of one hash chain of the event log. The sealing locks it (on PostgreSQL the
    sealer, after the writers' commits; on SQLite the insert trigger), so sealings of one chain
    take turns and each event names the one sealed before it. `chain` is "tenant:<id>" or
    "none"; written only by the sealing."""

    chain = models.CharField(max_length=40, primary_key=True)
    seq = models.BigIntegerField(default=0)
    hash = models.CharField(max_length=64, blank=True)

    def __str__(self) -> str:
        return f"{self.chain} #{self.seq}"


class Event(models.Model):
    """Append-only: written in the same transaction as every change of every record.

    The live views are the tail of this table (ordered by id), so a client that reconnects asks
    for events after the last id it saw. On PostgreSQL a trigger refuses UPDATE and DELETE.
    `to_status` is the entity's status after the event; `from_status` is set only for a
    transition. What happened is `kind`: most events are transitions, the rest say their name
    instead of posing as a move from a status to itself.
    """

    class Entity(models.TextChoices):
        TASK = "task"
        OPERATION = "operation"
        APPROVAL = "approval"
        CALL = "call"
        LEASE = "lease"
        PROVIDER_QUERY = "provider_query"
        STOP = "stop"  # an emergency stop of a tenant, an agent or a tool, and its resume
        AUDIT = "audit"  # a call run at once under an audited tier, reviewed or flagged after the fact

    class Kind(models.TextChoices):
        TRANSITION = "transition", "transition"
        CREATED = "created", "created"  # the record came to be; to_status is its first status
        APPROVAL_GIVEN = "approval_given", "approval given"  # one of several; still pending
        REASSIGNED = "reassigned", "reassigned"  # a manual case handed to another support person
        LEASE_ACQUIRED = "lease_acquired", "lease acquired"
        LEASE_TAKEN_OVER = "lease_taken_over", "lease taken over"
        PROVIDER_ANSWER = "provider_answer", "provider answered"  # to_status is the answer
        CALL_REFUSED = "call_refused", "call refused"
        CALL_MAPPED = "call_mapped", "call mapped"  # a new call ID for a step already in the ledger

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, null=True, related_name="+")
    entity = models.CharField(max_length=32, choices=Entity.choices)
    entity_id = models.CharField(max_length=64)
    kind = models.CharField(max_length=32, choices=Kind.choices, default=Kind.TRANSITION)
    from_status = models.CharField(max_length=32, blank=True)
    to_status = models.CharField(max_length=32, blank=True)
    actor = models.CharField(max_length=160)
    reason = models.TextField(blank=True)
    evidence = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # The hash chain (console/lib/audit.py): `content_hash` is written with the row; the sealing
    # (PostgreSQL: the sealer, after commit; SQLite: a trigger) fills the rest when it links the row
    # into its tenant's chain (or the chain of events with no tenant): `chain_seq` counts from 1,
    # `prev_hash` is the previous row's `hash`.
    content_hash = models.CharField(max_length=64, blank=True)
    chain_seq = models.BigIntegerField(null=True, blank=True)
    prev_hash = models.CharField(max_length=64, blank=True)
    hash = models.CharField(max_length=64, blank=True)

    class Meta:
        # The table keeps the name it was created with: the append-only trigger is bound to it.
        db_table = "ledger_event"
        indexes = [
            models.Index(fields=["entity", "entity_id", "id"], name="event_entity_idx"),
            models.Index(fields=["tenant", "id"], name="event_tenant_idx"),
            # The rows the sealer has still to link (console.lib.audit.seal_pending): a few at a time.
            models.Index(fields=["id"], condition=models.Q(chain_seq__isnull=True), name="event_unsealed"),
        ]
        constraints = [
            # A sealing that skipped the chain head's lock fails here instead of forking the chain.
            models.UniqueConstraint(fields=["tenant", "chain_seq"], condition=models.Q(tenant__isnull=False),
                                    name="event_chain_seq_unique"),
            models.UniqueConstraint(fields=["chain_seq"], condition=models.Q(tenant__isnull=True),
                                    name="event_untenanted_chain_seq_unique"),
        ]

    def __str__(self) -> str:
        if self.kind == self.Kind.TRANSITION:
            return f"#{self.id} {self.entity}:{self.entity_id} {self.from_status or '∅'}→{self.to_status}"
        return f"#{self.id} {self.entity}:{self.entity_id} {self.kind} {self.to_status}".rstrip()
