"""Tools, the policy tiers and escalation rules that gate them, approval requests and decisions."""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.indexes import GinIndex, OpClass
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models.functions import Upper
from django.utils import timezone

from console.models import Event, RiskTier


class HttpMethod(models.TextChoices):
    GET = "GET"
    HEAD = "HEAD"
    POST = "POST"
    PUT = "PUT"
    PATCH = "PATCH"
    DELETE = "DELETE"


class Tool(models.Model):
    class Kind(models.TextChoices):
        READ = "read"
        WRITE = "write"

    class Idempotency(models.TextChoices):
        NATIVE = "native", "Native idempotency key"
        QUERY = "query", "Query by key"
        NONE = "none", "None"

    class Queue(models.TextChoices):
        FAST = "fast"
        SLOW = "slow"

    name = models.CharField(max_length=100, unique=True, help_text="e.g. payments.refund")
    description = models.TextField(blank=True)
    adapter = models.CharField(max_length=100, help_text="Name of the adapter that executes it.")
    json_schema = models.JSONField(help_text="JSON Schema for the arguments.")
    schema_version = models.PositiveIntegerField(default=1)
    base_tier = models.PositiveSmallIntegerField(choices=RiskTier.choices, default=RiskTier.L1)
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.WRITE)
    idempotency = models.CharField(max_length=8, choices=Idempotency.choices, default=Idempotency.NONE)
    business_key = models.CharField(
        max_length=100, blank=True,
        help_text="Argument that names the business object; two operations on one never run at once.",
    )
    idempotency_key_template = models.CharField(
        max_length=255, blank=True,
        help_text="Business idempotency key, e.g. {tenant}:{order_id}:refund:{amount}. Empty: the operation ID.",
    )
    secret_fields = models.JSONField(default=list, blank=True, help_text="Argument names masked on screen.")
    has_preview = models.BooleanField(default=False)
    queue = models.CharField(max_length=8, choices=Queue.choices, default=Queue.FAST)
    timeout_seconds = models.FloatField(default=10.0)
    retryable_errors = models.JSONField(
        default=list, blank=True, help_text='Error classes retried automatically, e.g. ["rate_limited", "unavailable"].'
    )
    max_attempts = models.PositiveSmallIntegerField(default=3)
    total_deadline_seconds = models.PositiveIntegerField(default=300)
    backoff_base_seconds = models.FloatField(default=0.5)
    backoff_cap_seconds = models.FloatField(default=30.0)
    enabled = models.BooleanField(default=True)
    compensation_rule = models.JSONField(
        default=dict, blank=True,
        help_text='Which tools may compensate this tool\'s effects, and which of their arguments must match '
                  'the original call: {"payments.refund": {"order_id": "same", "currency": "same", '
                  '"amount": "at_most"}}. "same": equal to the original\'s; "at_most": a number no larger. '
                  "Empty: no compensating operation can be proposed; support settles such cases by hand.",
    )

    # -- a tool configured as data (adapter "http"; validated by approvals.tools.tool_config_errors) --
    # The request: method and URL template ({argument} placeholders; arguments not named in the
    # URL go into the JSON body, or into the query for a method without a body).
    http_method = models.CharField(max_length=7, choices=HttpMethod.choices, blank=True)
    http_url = models.CharField(
        max_length=2000, blank=True,
        help_text="URL template, e.g. https://api.example.com/orders/{order_id}/refunds?notify={notify}. "
                  "Placeholders name arguments; they are allowed in the path and the query only.",
    )
    http_headers = models.JSONField(
        default=dict, blank=True, help_text='Static headers, e.g. {"Accept": "application/json"}. No secrets here.')
    key_header = models.CharField(
        max_length=100, blank=True,
        help_text="Header that carries the operation's idempotency key, e.g. Idempotency-Key. Empty: none is sent.")
    # Credentials by reference only: the *name* of an environment variable or Django setting,
    # read by the worker at call time. The value is never stored or shown.
    credential_ref = models.CharField(
        max_length=100, blank=True,
        help_text="Name of the environment variable (or setting) holding the credential, e.g. TICKETS_API_TOKEN.")
    credential_header = models.CharField(max_length=100, blank=True, default="Authorization")
    credential_scheme = models.CharField(
        max_length=30, blank=True, default="Bearer", help_text="Written before the credential, e.g. Bearer.")
    status_query = models.JSONField(
        default=dict, blank=True,
        help_text='How to ask the provider about a key: {"url": "https://…/by-key/{key}", '
                  '"found": {"status": 200, "field": "state", "equals": "succeeded"}, '
                  '"processing": {…}, "absent": {"status": 404}, "object": "refund"}. Empty: cannot ask.',
    )
    receipt_fields = models.JSONField(
        default=dict, blank=True,
        help_text='Receipt name → dotted path in the JSON answer, e.g. {"remote_id": "id", "amount": "amount"}.')
    result_fields = models.JSONField(
        default=list, blank=True, help_text='Dotted paths kept as the result, e.g. ["id", "status"]. Empty: the whole answer.')

    # -- a tool of an MCP server (adapter "mcp"; ledger.adapters.mcp) --
    mcp_server = models.CharField(
        max_length=2000, blank=True,
        help_text="The MCP server: a streamable HTTP URL (https://tools.example.com/mcp) or a stdio command "
                  "line (uvx some-mcp-server --flag). Credentials go by reference (credential_ref), never here.")
    mcp_tool = models.CharField(max_length=200, blank=True, help_text="The tool's name at the MCP server.")

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        errors = compensation_rule_errors(self.compensation_rule)
        if errors:
            raise ValidationError({"compensation_rule": errors})


COMPENSATION_CHECKS = ("same", "at_most")


def compensation_rule_errors(rule: object) -> list[str]:
    """What is wrong with a tool's compensation rule (empty: nothing)."""
    if not isinstance(rule, dict):
        return ['Expected an object: {"<compensating tool>": {"<argument>": "same" | "at_most"}}.']
    errors = []
    for tool_name, checks in rule.items():
        if not isinstance(checks, dict):
            errors.append(f"{tool_name}: expected an object of argument → check.")
            continue
        for argument, check in checks.items():
            if check not in COMPENSATION_CHECKS:
                errors.append(f"{tool_name}.{argument}: {check!r} is not one of {', '.join(COMPENSATION_CHECKS)}.")
    return errors


class PolicyTier(models.Model):
    class Requirement(models.TextChoices):
        RUN = "run", "Run"
        RUN_AUDIT = "run_audit", "Run and audit"
        ONE_APPROVAL = "one_approval", "One approval"
        TWO_APPROVALS = "two_approvals", "Two approvals"
        FORBIDDEN = "forbidden", "Forbidden"

    level = models.PositiveSmallIntegerField(choices=RiskTier.choices, unique=True)
    requirement = models.CharField(max_length=16, choices=Requirement.choices)
    shows_preview = models.BooleanField(default=False)
    approval_ttl_seconds = models.PositiveIntegerField(default=3600)
    description = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["level"]

    def __str__(self) -> str:
        return f"L{self.level}: {self.get_requirement_display()}"

    @property
    def approvals_needed(self) -> int:
        return {self.Requirement.ONE_APPROVAL: 1, self.Requirement.TWO_APPROVALS: 2}.get(self.requirement, 0)


class EscalationRule(models.Model):
    """Raises (never lowers) a call's tier when an argument matches."""

    class Comparison(models.TextChoices):
        GT = "gt", ">"
        GTE = "gte", "≥"
        LT = "lt", "<"
        LTE = "lte", "≤"
        EQ = "eq", "="
        NE = "ne", "≠"
        IN = "in", "in"
        CONTAINS = "contains", "contains"

    tool = models.ForeignKey(Tool, on_delete=models.CASCADE, related_name="escalation_rules")
    argument_path = models.CharField(max_length=200, help_text="Dotted path into the arguments, e.g. amount or to.0")
    comparison = models.CharField(max_length=8, choices=Comparison.choices)
    value = models.JSONField()
    tier = models.PositiveSmallIntegerField(choices=RiskTier.choices)
    description = models.CharField(max_length=200, blank=True)

    def __str__(self) -> str:
        return f"{self.tool}: {self.argument_path} {self.get_comparison_display()} {self.value} → L{self.tier}"


class ApprovalStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    SUPERSEDED = "superseded"
    INVALIDATED = "invalidated"
    CONSUMED = "consumed"


APPROVAL_TRANSITIONS: dict[str, frozenset[str]] = {
    ApprovalStatus.PENDING: frozenset({ApprovalStatus.APPROVED, ApprovalStatus.REJECTED, ApprovalStatus.EXPIRED, ApprovalStatus.SUPERSEDED, ApprovalStatus.INVALIDATED}),
    # Approved but not yet dispatched: the dispatcher's re-check consumes it or finds it stale.
    ApprovalStatus.APPROVED: frozenset({ApprovalStatus.CONSUMED, ApprovalStatus.EXPIRED, ApprovalStatus.INVALIDATED}),
    ApprovalStatus.REJECTED: frozenset(),
    ApprovalStatus.EXPIRED: frozenset(),
    ApprovalStatus.SUPERSEDED: frozenset(),
    ApprovalStatus.INVALIDATED: frozenset(),
    ApprovalStatus.CONSUMED: frozenset(),
}


class ApprovalRequest(models.Model):
    """Bound to one call ID, its operation, the canonical argument hash, the task's state
    version and an expiry. Approving anything else is approving something nobody saw."""

    TRANSITIONS = APPROVAL_TRANSITIONS
    EVENT_ENTITY = Event.Entity.APPROVAL

    approval_id = models.CharField(max_length=64, primary_key=True)
    tenant = models.ForeignKey("console.Tenant", on_delete=models.PROTECT, related_name="approval_requests")
    task = models.ForeignKey("runs.Task", on_delete=models.PROTECT, related_name="approval_requests")
    operation = models.ForeignKey("ledger.Operation", on_delete=models.PROTECT, related_name="approval_requests")
    # Copies of the operation's tool and the task's type (both fixed for the request's life), so
    # that the inbox's filters read this table and its indexes alone, without joining
    # 100,000 operations (bench/inbox.py). Set by approval_request_create.
    tool = models.ForeignKey(Tool, on_delete=models.PROTECT, related_name="+")
    task_type = models.CharField(max_length=100)
    call_id = models.CharField(max_length=128)
    arguments_hash = models.CharField(max_length=64)
    tool_schema_version = models.PositiveIntegerField()
    requested_by = models.ForeignKey("console.AgentPrincipal", on_delete=models.PROTECT, related_name="+")
    # A call a person created (a compensation, an edit) names that person: they can never
    # approve it (approvals.services.approval_give). Empty: the agent proposed it.
    proposed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+",
        help_text="The person who proposed this call; never one of its approvers. Empty: the agent did.",
    )
    state_version = models.PositiveIntegerField(help_text="The task's version when the call was proposed.")
    risk_tier = models.PositiveSmallIntegerField(choices=RiskTier.choices)
    escalation_reasons = models.JSONField(default=list, blank=True)
    approvals_needed = models.PositiveSmallIntegerField(default=1)
    status = models.CharField(max_length=16, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING)
    expires_at = models.DateTimeField()
    created_at = models.DateTimeField(default=timezone.now)
    decided_at = models.DateTimeField(null=True, blank=True)
    superseded_by = models.ForeignKey("self", on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    # Undecided after a share of its time: its tier's reviewers are reminded, later the next
    # tier's are told (approvals.notifications.notifications_remind_due). Set at creation.
    remind_at = models.DateTimeField(null=True, blank=True)
    escalate_at = models.DateTimeField(null=True, blank=True)
    reminded_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "status", "expires_at"], name="approval_inbox_idx"),
            models.Index(fields=["status", "expires_at"], name="approval_sweep_idx"),
            # The reminder sweep reads pending requests whose reminder or escalation is due.
            models.Index(fields=["remind_at"], condition=models.Q(status="pending", reminded_at__isnull=True),
                         name="approval_remind_idx"),
            models.Index(fields=["escalate_at"], condition=models.Q(status="pending", escalated_at__isnull=True),
                         name="approval_escalate_idx"),
            # One per inbox filter, over pending requests only (decided ones pile up forever;
            # the inbox never reads them): the filtered page and its COUNT are index scans.
            *[
                models.Index(fields=["tenant", column, "expires_at"], condition=models.Q(status="pending"),
                             name=f"approval_inbox_{short}_idx")
                for column, short in (("tool", "tool"), ("risk_tier", "tier"), ("task_type", "type"),
                                      ("requested_by", "agent"))
            ],
            # The inbox's search by ID (approvals.filters) is `icontains` over these four
            # columns, UPPER(col) LIKE UPPER('%q%') on PostgreSQL: a trigram index over the same
            # expressions finds the few matches without reading every pending request.
            # PostgreSQL only (pg_trgm): migration 0019 creates it there and nothing on SQLite.
            GinIndex(*[OpClass(Upper(column), name="gin_trgm_ops")
                       for column in ("approval_id", "call_id", "operation_id", "task_id")],
                     condition=models.Q(status="pending"), name="approval_search_trgm_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.approval_id} ({self.status})"


class PendingCount(models.Model):
    """Pending approval requests per tenant and tier, kept as signed deltas: a trigger on
    approvals_approvalrequest (migration 0018) adds +1 when a request becomes pending and -1
    when it stops being pending, or moves tier or tenant while pending, in the transaction that
    moves it, whoever writes it (a service, a bulk update, the sweeper). The inbox's per-tier
    counts are the deltas' sums (`selectors.tier_counts`), exact at any snapshot, instead of a
    COUNT over every pending request on each page.

    Deltas rather than one row per tenant and tier: an insert takes no lock that another
    transaction waits for, so concurrent proposals do not queue behind one counter row and
    transactions that touch two tiers in opposite orders cannot deadlock. Readers fold the
    deltas back into one row per tenant and tier once they pile up (`selectors.compact_pending_counts`).
    The tenant is a bare column, not a foreign key: the trigger's insert checks nothing else."""

    tenant_id = models.BigIntegerField()
    risk_tier = models.PositiveSmallIntegerField()
    delta = models.IntegerField()

    class Meta:
        indexes = [models.Index(fields=["tenant_id", "risk_tier"], name="approval_pending_count_idx")]

    def __str__(self) -> str:
        return f"tenant {self.tenant_id} L{self.risk_tier} {self.delta:+d}"


class ApprovalDecision(models.Model):
    class Verdict(models.TextChoices):
        APPROVE = "approve"
        REJECT = "reject"

    request = models.ForeignKey(ApprovalRequest, on_delete=models.PROTECT, related_name="decisions")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    verdict = models.CharField(max_length=8, choices=Verdict.choices)
    reason = models.TextField(blank=True)
    arguments_hash = models.CharField(max_length=64, help_text="What the reviewer saw.")
    created_at = models.DateTimeField(default=timezone.now)
    signature = models.CharField(
        max_length=64, blank=True,
        help_text="HMAC-SHA256 receipt over call, arguments hash, task version, approver, verdict and time "
                  "(console/lib/audit.py); the dispatcher refuses an approval whose receipts do not hold.")

    class Meta:
        constraints = [
            # Two approvals means two distinct people.
            models.UniqueConstraint(fields=["request", "reviewer"], name="decision_one_per_reviewer"),
        ]
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.reviewer} {self.verdict} {self.request_id}"


class NotificationChannel(models.Model):
    """Where reviewers hear of pending requests of one tier (new, reminders, escalations), or
    where support staff hear of operations that need a person (webhook or email)."""

    class Kind(models.TextChoices):
        WEBHOOK = "webhook"
        EMAIL = "email"

    class Audience(models.TextChoices):
        REVIEWERS = "reviewers", "Reviewers (approval requests of one tier)"
        SUPPORT = "support", "Support (operations that go manual or need compensation)"

    tenant = models.ForeignKey(
        "console.Tenant", on_delete=models.CASCADE, null=True, blank=True, related_name="notification_channels",
        help_text="Empty: requests of every tenant.",
    )
    audience = models.CharField(max_length=16, choices=Audience.choices, default=Audience.REVIEWERS)
    tier = models.PositiveSmallIntegerField(choices=RiskTier.choices, null=True, blank=True,
                                            help_text="Reviewers: requests of exactly this tier. Support: empty.")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    target = models.CharField(max_length=500, help_text="The webhook's URL, or an email address.")
    enabled = models.BooleanField(default=True)
    description = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["tier", "id"]

    def __str__(self) -> str:
        who = f"L{self.tier}" if self.tier is not None else self.audience
        return f"{who} {self.kind} → {self.target}"

    def clean(self) -> None:
        if (self.audience == self.Audience.REVIEWERS) != (self.tier is not None):
            raise ValidationError({"tier": "A reviewers' channel names its tier; a support channel has none."})
        # A target that can never be delivered to is refused where it is typed (the admin),
        # not discovered at the first pending request.
        from django.core.validators import EmailValidator, URLValidator

        validator = URLValidator(schemes=["http", "https"]) if self.kind == self.Kind.WEBHOOK else EmailValidator()
        try:
            validator(self.target)
        except ValidationError as exc:
            raise ValidationError({"target": f"Not a valid {'http(s) URL' if self.kind == self.Kind.WEBHOOK else 'email address'}."}) from exc


class NotificationStatus(models.TextChoices):
    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"


class Notification(models.Model):
    """One delivery of one alert to one channel — a new approval request, a reminder or an
    escalation of one, or an operation that needs a person; every failed attempt is kept in
    `errors` (the broker may lose or repeat the task: this row decides)."""

    class Kind(models.TextChoices):
        REQUEST = "request", "New request"
        REMINDER = "reminder", "Reminder"
        ESCALATION = "escalation", "Escalation to the next tier"
        OPERATION = "operation", "Operation needs a person"

    channel = models.ForeignKey(NotificationChannel, on_delete=models.PROTECT, related_name="notifications")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.REQUEST)
    approval = models.ForeignKey(ApprovalRequest, on_delete=models.PROTECT, null=True, blank=True,
                                 related_name="notifications")
    operation = models.ForeignKey("ledger.Operation", on_delete=models.PROTECT, null=True, blank=True,
                                  related_name="+")
    operation_status = models.CharField(max_length=32, blank=True, help_text="The status the operation moved to.")
    status = models.CharField(max_length=8, choices=NotificationStatus.choices, default=NotificationStatus.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_error = models.TextField(blank=True)
    errors = models.JSONField(default=list, blank=True, help_text="Every failed attempt: {attempt, at, error}.")
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["channel", "approval", "kind"], condition=models.Q(approval__isnull=False),
                                    name="notification_one_per_channel"),
            models.UniqueConstraint(fields=["channel", "operation", "operation_status"],
                                    condition=models.Q(operation__isnull=False), name="notification_one_per_move"),
        ]
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="notification_due_idx")]
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.approval_id or self.operation_id} → {self.channel} ({self.status})"


class PolicyGeneration(models.Model):
    """One row whose token names the current configuration of tools, escalation rules, policy
    tiers and agents' allowed tools. Database triggers (migration 0007) write a new random token
    whenever any of them changes; `approvals.catalog` caches the gate's reads by it."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    token = models.CharField(max_length=32)

    def __str__(self) -> str:
        return self.token


class StopStatus(models.TextChoices):
    STOPPED = "stopped"
    RESUMED = "resumed"


STOP_TRANSITIONS: dict[str, frozenset[str]] = {
    StopStatus.STOPPED: frozenset({StopStatus.RESUMED}),
    StopStatus.RESUMED: frozenset(),
}


class Stop(models.Model):
    """An emergency stop of a tenant, one of its agents or one tool within it.

    While it holds: no new proposals in its scope, no new dispatch or attempt (retries and
    reconciliation's redispatches included), pending approvals frozen. Attempts already claimed
    finish and are recorded. Resuming ends it; a new stop is a new row, so the table is the
    history of who stopped what, when and why."""

    TRANSITIONS = STOP_TRANSITIONS
    EVENT_ENTITY = Event.Entity.STOP

    class Scope(models.TextChoices):
        TENANT = "tenant"
        AGENT = "agent"
        TOOL = "tool"

    stop_id = models.CharField(max_length=64, primary_key=True)
    tenant = models.ForeignKey("console.Tenant", on_delete=models.PROTECT, related_name="stops")
    scope = models.CharField(max_length=8, choices=Scope.choices)
    agent = models.ForeignKey("console.AgentPrincipal", on_delete=models.PROTECT, null=True, blank=True,
                              related_name="+")
    tool = models.ForeignKey(Tool, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    # "tenant", "agent:<id>" or "tool:<id>": one stop in force per scope (the constraint below).
    scope_key = models.CharField(max_length=40, editable=False)
    status = models.CharField(max_length=8, choices=StopStatus.choices, default=StopStatus.STOPPED)
    reason = models.TextField()
    stopped_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    resumed_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True,
                                   related_name="+")
    resumed_at = models.DateTimeField(null=True, blank=True)
    resume_reason = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "scope_key"], condition=models.Q(status="stopped"),
                                    name="stop_one_in_force_per_scope"),
        ]
        indexes = [models.Index(fields=["tenant", "status"], name="stop_tenant_status_idx")]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.describe()} ({self.status})"

    def describe(self) -> str:
        """What is stopped, in words: "tenant acme", "agent acme/bot", "tool payments.refund in acme"."""
        if self.scope == self.Scope.AGENT:
            return f"agent {self.agent}"
        if self.scope == self.Scope.TOOL:
            return f"tool {self.tool} in {self.tenant}"
        return f"tenant {self.tenant}"


class AuditStatus(models.TextChoices):
    UNREVIEWED = "unreviewed"
    REVIEWED = "reviewed"
    FLAGGED = "flagged"


# A review is final: a flag stays a flag, and a call marked reviewed is not reopened.
AUDIT_TRANSITIONS: dict[str, frozenset[str]] = {
    AuditStatus.UNREVIEWED: frozenset({AuditStatus.REVIEWED, AuditStatus.FLAGGED}),
    AuditStatus.REVIEWED: frozenset(),
    AuditStatus.FLAGGED: frozenset(),
}


class AuditReview(models.Model):
    """A call the gate ran at once under an audited tier (requirement "run and audit"), waiting
    for a reviewer to look at it after the fact: marked reviewed, or flagged with a note.

    Written in the proposal's statement, one per operation (its primary key), so a regenerated
    call for the same step adds none. Reviewers of the call's tier or above in its tenant review
    it; the person who proposed it (`proposed_by`, an editor whose edit ran at once) does not."""

    TRANSITIONS = AUDIT_TRANSITIONS
    EVENT_ENTITY = Event.Entity.AUDIT

    operation = models.OneToOneField("ledger.Operation", on_delete=models.PROTECT, primary_key=True,
                                     related_name="audit_review")
    tenant = models.ForeignKey("console.Tenant", on_delete=models.PROTECT, related_name="+")
    # Copies of the operation's (fixed for its life), so the list and its filters read this table.
    tool = models.ForeignKey(Tool, on_delete=models.PROTECT, related_name="+")
    call_id = models.CharField(max_length=128)
    risk_tier = models.PositiveSmallIntegerField(choices=RiskTier.choices)
    requested_by = models.ForeignKey("console.AgentPrincipal", on_delete=models.PROTECT, related_name="+")
    proposed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+",
        help_text="The person who proposed this call (an edit that ran at once); never its reviewer. Empty: the agent.",
    )
    status = models.CharField(max_length=16, choices=AuditStatus.choices, default=AuditStatus.UNREVIEWED)
    note = models.TextField(blank=True)
    reviewed_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True,
                                    related_name="+")
    reviewed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "status", "created_at"], name="audit_list_idx"),
            models.Index(fields=["tenant", "created_at"], name="audit_day_idx"),
        ]
        ordering = ["-created_at", "operation_id"]

    def __str__(self) -> str:
        return f"audit of {self.operation_id} ({self.status})"


class BudgetCap(models.Model):
    """An administrator's ceiling on what agents spend: per task and per day (the tenant's day),
    over the whole tenant, one of its agents, or one tool within it. A task contract's own
    budgets can only lower these: the gate applies the least of the contract's and every cap
    that covers the call (`approvals.caps`). Empty: no cap of that kind."""

    class Scope(models.TextChoices):
        TENANT = "tenant"
        AGENT = "agent"
        TOOL = "tool"

    tenant = models.ForeignKey("console.Tenant", on_delete=models.CASCADE, related_name="budget_caps")
    agent = models.ForeignKey("console.AgentPrincipal", on_delete=models.CASCADE, null=True, blank=True,
                              related_name="budget_caps", help_text="Caps this agent only (leave the tool empty).")
    tool = models.ForeignKey(Tool, on_delete=models.CASCADE, null=True, blank=True, related_name="budget_caps",
                             help_text="Caps this tool in the tenant only (leave the agent empty). Per task: "
                                       "the calls of this tool in one task.")
    calls_per_task = models.PositiveIntegerField(null=True, blank=True)
    writes_per_task = models.PositiveIntegerField(null=True, blank=True)
    amount_per_task = models.DecimalField(max_digits=18, decimal_places=4, null=True, blank=True)
    calls_per_day = models.PositiveIntegerField(null=True, blank=True)
    writes_per_day = models.PositiveIntegerField(null=True, blank=True)
    amount_per_day = models.DecimalField(max_digits=18, decimal_places=4, null=True, blank=True)
    # The agent's model spend (its spans' token usage at the model prices), known only after each
    # model call: once spent, the next tool call is refused. Tenant and agent caps only.
    cost_per_task = models.DecimalField(max_digits=18, decimal_places=4, null=True, blank=True,
                                        help_text="Model cost of one task, in the cost currency.")
    cost_per_day = models.DecimalField(max_digits=18, decimal_places=4, null=True, blank=True,
                                       help_text="Model cost of the tenant's (or the agent's) tasks in its day.")
    cost_currency = models.CharField(max_length=3, blank=True,
                                     help_text="The currency of the cost caps (spend priced in another is not counted).")
    description = models.CharField(max_length=200, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(agent__isnull=True) | models.Q(tool__isnull=True),
                                   name="budget_cap_agent_or_tool"),
            models.UniqueConstraint(fields=["tenant"], condition=models.Q(agent__isnull=True, tool__isnull=True),
                                    name="budget_cap_one_per_tenant"),
            models.UniqueConstraint(fields=["tenant", "agent"], condition=models.Q(agent__isnull=False),
                                    name="budget_cap_one_per_agent"),
            models.UniqueConstraint(fields=["tenant", "tool"], condition=models.Q(tool__isnull=False),
                                    name="budget_cap_one_per_tool"),
        ]

    def __str__(self) -> str:
        return f"caps of {self.describe()}"

    @property
    def scope(self) -> str:
        if self.agent_id is not None:
            return self.Scope.AGENT
        if self.tool_id is not None:
            return self.Scope.TOOL
        return self.Scope.TENANT

    @property
    def counter_key(self) -> str:
        """Names the usage this cap counts per day ("tenant:3", "agent:7", "tool:3:12")."""
        if self.agent_id is not None:
            return f"agent:{self.agent_id}"
        if self.tool_id is not None:
            return f"tool:{self.tenant_id}:{self.tool_id}"
        return f"tenant:{self.tenant_id}"

    def describe(self) -> str:
        if self.agent_id is not None:
            return f"agent {self.agent}"
        if self.tool_id is not None:
            return f"tool {self.tool} in {self.tenant}"
        return f"tenant {self.tenant}"

    def clean(self) -> None:
        if self.agent_id is not None and self.tool_id is not None:
            raise ValidationError("A cap covers the tenant, one agent or one tool: not an agent and a tool.")
        if self.cost_per_task is not None or self.cost_per_day is not None:
            if self.tool_id is not None:
                raise ValidationError("The model's cost is the agent's, not a tool's: cap it on the tenant or the agent.")
            if not self.cost_currency:
                raise ValidationError({"cost_currency": "A cost cap needs its currency (e.g. USD)."})
        if self.agent_id is not None and self.tenant_id is not None and self.agent.tenant_id != self.tenant_id:
            raise ValidationError({"agent": "This agent belongs to another tenant."})
