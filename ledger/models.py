"""The operation ledger: one row per external effect, its attempts, and the append-only event log."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from console.models import Event


class OperationStatus(models.TextChoices):
    PLANNED = "planned"
    AUTHORIZED = "authorized"
    DISPATCHED = "dispatched"
    CONFIRMED = "confirmed"
    FAILED = "failed"
    UNKNOWN = "unknown"
    RETRY_SAFE = "retry_safe"
    COMPENSATION_REQUIRED = "compensation_required"
    COMPENSATED = "compensated"
    MANUAL = "manual"
    REJECTED = "rejected"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


# The only moves an operation may make. `dispatched` never goes back to planned or authorized;
# a timeout goes to `unknown`, never to `failed`. `authorized → expired | cancelled` is the
# dispatcher's re-check finding the approval expired or the task moved on. `dispatched →
# retry_safe` needs the provider's promise of no effect (429, 503 before commit, refused
# connection): the retry keeps the operation ID and key, attempt + 1.
OPERATION_TRANSITIONS: dict[str, frozenset[str]] = {
    OperationStatus.PLANNED: frozenset({OperationStatus.AUTHORIZED, OperationStatus.REJECTED, OperationStatus.EXPIRED, OperationStatus.CANCELLED}),
    # authorized → planned: the dispatcher's re-check found the policy stricter than the approval
    # (or the run-at-once verdict) it was authorized under; it waits for the approvals now required.
    OperationStatus.AUTHORIZED: frozenset({OperationStatus.DISPATCHED, OperationStatus.EXPIRED, OperationStatus.CANCELLED, OperationStatus.PLANNED}),
    OperationStatus.DISPATCHED: frozenset({OperationStatus.CONFIRMED, OperationStatus.FAILED, OperationStatus.UNKNOWN, OperationStatus.RETRY_SAFE}),
    OperationStatus.UNKNOWN: frozenset({OperationStatus.CONFIRMED, OperationStatus.RETRY_SAFE, OperationStatus.COMPENSATION_REQUIRED, OperationStatus.MANUAL, OperationStatus.FAILED}),
    OperationStatus.MANUAL: frozenset({OperationStatus.CONFIRMED, OperationStatus.RETRY_SAFE, OperationStatus.COMPENSATION_REQUIRED, OperationStatus.FAILED}),
    OperationStatus.RETRY_SAFE: frozenset({OperationStatus.DISPATCHED, OperationStatus.FAILED}),
    # Ends when a compensating operation is confirmed, or a person settles it with evidence.
    OperationStatus.COMPENSATION_REQUIRED: frozenset({OperationStatus.COMPENSATED}),
    OperationStatus.COMPENSATED: frozenset(),
    OperationStatus.CONFIRMED: frozenset(),
    OperationStatus.FAILED: frozenset(),
    OperationStatus.REJECTED: frozenset(),
    OperationStatus.EXPIRED: frozenset(),
    OperationStatus.CANCELLED: frozenset(),
}
OPERATION_TERMINAL = frozenset(s for s, moves in OPERATION_TRANSITIONS.items() if not moves)
OPERATION_NEEDS_PERSON = frozenset({OperationStatus.UNKNOWN, OperationStatus.MANUAL, OperationStatus.COMPENSATION_REQUIRED})


class Operation(models.Model):
    """One external effect. Its ID is derived from (tenant, task, step, tool) and is the
    idempotency key sent to the provider unless the tool defines a business key."""

    TRANSITIONS = OPERATION_TRANSITIONS
    EVENT_ENTITY = Event.Entity.OPERATION

    operation_id = models.CharField(max_length=64, primary_key=True)
    tenant = models.ForeignKey("console.Tenant", on_delete=models.PROTECT, related_name="operations")
    task = models.ForeignKey("runs.Task", on_delete=models.PROTECT, related_name="operations")
    step = models.ForeignKey("runs.Step", on_delete=models.PROTECT, related_name="operations")
    tool = models.ForeignKey("approvals.Tool", on_delete=models.PROTECT, related_name="operations")
    tool_schema_version = models.PositiveIntegerField()
    principal = models.ForeignKey("console.AgentPrincipal", on_delete=models.PROTECT, related_name="operations")
    call_id = models.CharField(max_length=128, help_text="The call that created this operation.")
    arguments = models.JSONField()
    arguments_hash = models.CharField(max_length=64)
    intent_hash = models.CharField(max_length=64)
    idempotency_key = models.CharField(max_length=255)
    business_key = models.CharField(max_length=255, blank=True, help_text="Mutual exclusion, e.g. the order ID.")
    risk_tier = models.PositiveSmallIntegerField()
    needs_approval = models.BooleanField(
        default=True,
        help_text="False only when the gate ran the call at once: the dispatcher then looks up no approval.",
    )
    status = models.CharField(max_length=32, choices=OperationStatus.choices, default=OperationStatus.PLANNED)
    attempt_count = models.PositiveIntegerField(default=0)
    fencing_token = models.PositiveBigIntegerField(default=0)
    dispatch_deadline = models.DateTimeField(null=True, blank=True)
    receipt = models.JSONField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    last_error = models.CharField(max_length=255, blank=True)
    not_before = models.DateTimeField(null=True, blank=True, help_text="Backoff: no retry before this time.")
    next_redispatch_at = models.DateTimeField(
        null=True, blank=True,
        help_text="The sweeper pushes an authorized or retry-safe operation again no earlier than this.",
    )
    reconcile_attempts = models.PositiveIntegerField(default=0)
    next_reconcile_at = models.DateTimeField(null=True, blank=True)
    compensates = models.ForeignKey("self", on_delete=models.PROTECT, null=True, blank=True, related_name="compensations")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "status", "updated_at"], name="operation_queue_idx"),
            models.Index(fields=["status", "updated_at"], name="operation_sweep_idx"),
            models.Index(fields=["tool", "business_key", "status"], name="operation_business_key_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.operation_id} ({self.status})"


class Call(models.Model):
    """A model's tool call. Unique within its task; several calls may map to one operation
    (the model regenerated the same step with a new call ID). Approvals bind to a call.

    A call the gate refused has no operation: its refusal is kept here, so a repeat of it is
    answered with the same refusal and it can be read back like any other call."""

    task = models.ForeignKey("runs.Task", on_delete=models.PROTECT, related_name="calls")
    call_id = models.CharField(max_length=128)
    operation = models.ForeignKey(Operation, on_delete=models.PROTECT, related_name="calls", null=True, blank=True)
    arguments_hash = models.CharField(max_length=64)
    # A database default: the proposal's single statement inserts calls with the columns it names.
    step_id = models.CharField(max_length=128, blank=True, db_default="",
                               help_text="Kept for a refused call (no operation).")
    tool_name = models.CharField(max_length=100, blank=True, db_default="",
                                 help_text="Kept for a refused call (no operation).")
    refusal = models.JSONField(null=True, blank=True,
                               help_text="The gate's refusal: reasons, risk tier, exhausted budgets.")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "call_id"], name="call_unique_per_task"),
        ]

    def __str__(self) -> str:
        return self.call_id


class Fact(models.TextChoices):
    """The four facts of a call (docs/architecture.md): what an attempt's outcome says about the effect."""

    NOT_SENT = "not_sent"
    KNOWN_FAILURE = "known_failure"
    UNKNOWN = "unknown"
    KNOWN_SUCCESS = "known_success"


class Attempt(models.Model):
    """One dispatch of an operation. A stale worker's late result is kept here as evidence."""

    operation = models.ForeignKey(Operation, on_delete=models.PROTECT, related_name="attempts")
    number = models.PositiveIntegerField()
    fencing_token = models.PositiveBigIntegerField()
    worker = models.CharField(max_length=160, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    fact = models.CharField(max_length=16, choices=Fact.choices, blank=True)
    error_class = models.CharField(max_length=64, blank=True)
    error_code = models.CharField(max_length=64, blank=True)
    raw_response = models.JSONField(null=True, blank=True)
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    stale = models.BooleanField(default=False, help_text="Arrived after a newer token took over; changed no status.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["operation", "number"], name="attempt_unique_number"),
        ]
        # The circuit breaker and the retry budget read only the last minute of attempts.
        indexes = [models.Index(fields=["started_at"], name="attempt_started_idx")]
        ordering = ["operation", "number"]

    def __str__(self) -> str:
        return f"{self.operation_id}#{self.number}"


class ToolCircuit(models.Model):
    """The circuit breaker's last verdict for a tool: open until `open_until`.

    Written when a transient failure is recorded (`ledger.retry.circuit_note_failure`), read by
    every claim together with its operation. Counting the last window of attempts on every
    dispatch made each claim cost more the busier the tool was; the count now runs only when a
    transient failure lands, and again at a claim while the stored verdict says open (so the
    circuit closes as soon as the window says so, e.g. after the cooldown)."""

    tool = models.OneToOneField("approvals.Tool", on_delete=models.CASCADE, primary_key=True, related_name="circuit")
    open_until = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.tool_id}: open until {self.open_until}" if self.open_until else f"{self.tool_id}: closed"


class WorkerHeartbeat(models.Model):
    """One Celery worker (by node name): alive when `seen_at` is recent, progressing when
    `progressed_at` is. A worker can look alive and make no progress (a deadlocked pool, a
    frozen process); ledger.liveness tells the two apart."""

    name = models.CharField(max_length=200, primary_key=True, help_text="Celery node name, e.g. worker1@host.")
    hostname = models.CharField(max_length=200, blank=True)
    pid = models.IntegerField(default=0)
    pool = models.CharField(max_length=40, blank=True)
    queues = models.JSONField(default=list)
    started_at = models.DateTimeField(default=timezone.now)
    seen_at = models.DateTimeField(default=timezone.now)
    progressed_at = models.DateTimeField(null=True, blank=True, help_text="The last task the worker finished.")
    tasks_done = models.BigIntegerField(default=0, help_text="Finished tasks, counted at most once a second.")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class LivenessAlert(models.Model):
    """An episode of due work left waiting longer than LIVENESS_ALERT_SECONDS: raised once (and
    sent to the operator channels), cleared when the oldest due operation is young again."""

    raised_at = models.DateTimeField(default=timezone.now)
    cleared_at = models.DateTimeField(null=True, blank=True)
    oldest_due_seconds = models.FloatField()
    due_count = models.IntegerField()
    detail = models.JSONField(default=dict)

    class Meta:
        ordering = ["-raised_at"]

    def __str__(self) -> str:
        return f"liveness alert {self.raised_at:%Y-%m-%d %H:%M:%S}" + (" (cleared)" if self.cleared_at else "")


class WebhookEventKind(models.TextChoices):
    DECIDED = "call.decided"  # the decision on a held call: approved, rejected, expired, cancelled, asked again
    FINAL = "call.final"  # nothing more will happen to the call


class WebhookStatus(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"  # the receiver answered 2xx
    FAILED = "failed"  # attempts spent, the URL refused, or the receiver answered 410 Gone


class WebhookEvent(models.Model):
    """The outbox of decision webhooks: one row per event, written in the transaction that moved
    the operation (so a decision that commits has its event, and a rolled-back one has none),
    sent afterwards by a task (`ledger.webhooks.webhook_deliver`). `payload` is the body as of
    that commit; `webhook_id` is Standard Webhooks' message ID, the same on every attempt."""

    webhook_id = models.CharField(max_length=40, unique=True)
    tenant = models.ForeignKey("console.Tenant", on_delete=models.PROTECT, related_name="+")
    principal = models.ForeignKey("console.AgentPrincipal", on_delete=models.PROTECT, related_name="webhook_events")
    operation = models.ForeignKey(Operation, on_delete=models.PROTECT, related_name="webhook_events")
    call_id = models.CharField(max_length=64)
    kind = models.CharField(max_length=20, choices=WebhookEventKind.choices)
    operation_status = models.CharField(max_length=32, help_text="The operation's status the event tells of.")
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=WebhookStatus.choices, default=WebhookStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="webhook_event_due")]

    def __str__(self) -> str:
        return f"{self.kind} {self.call_id} ({self.status})"


class WebhookDelivery(models.Model):
    """One attempt to deliver a webhook event, as it went."""

    event = models.ForeignKey(WebhookEvent, on_delete=models.CASCADE, related_name="deliveries")
    number = models.PositiveIntegerField()
    url = models.CharField(max_length=500)
    started_at = models.DateTimeField()
    status_code = models.IntegerField(null=True, blank=True, help_text="Empty: no answer (refused, timeout, error).")
    error = models.CharField(max_length=500, blank=True)
    response_body = models.CharField(max_length=500, blank=True, help_text="The first bytes of the answer.")
    duration_ms = models.IntegerField(null=True, blank=True)
    next_retry_at = models.DateTimeField(null=True, blank=True, help_text="Empty: no further attempt.")

    class Meta:
        ordering = ["event", "number"]
        constraints = [models.UniqueConstraint(fields=["event", "number"], name="webhook_delivery_unique_number")]

    def __str__(self) -> str:
        return f"{self.event.webhook_id}#{self.number}"
