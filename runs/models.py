"""Workflow state: task contracts, their steps, and the leases that fence their workers."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from console.models import Event, RiskTier


class TaskStatus(models.TextChoices):
    QUEUED = "queued"
    PLANNING = "planning"
    RUNNING = "running"
    WAITING_APPROVAL = "waiting_approval"
    WAITING_EXTERNAL = "waiting_external"
    VERIFYING = "verifying"
    WAITING_REVIEW = "waiting_review"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PAUSED = "paused"


# `succeeded` is reachable only from `verifying`, through the verifiers' evidence, or from
# `waiting_review`, through a reviewer's confirmation of the human criteria (with evidence).
TASK_TRANSITIONS: dict[str, frozenset[str]] = {
    TaskStatus.QUEUED: frozenset({TaskStatus.PLANNING, TaskStatus.CANCELLED}),
    TaskStatus.PLANNING: frozenset({TaskStatus.RUNNING, TaskStatus.FAILED, TaskStatus.CANCELLED}),
    TaskStatus.RUNNING: frozenset({TaskStatus.WAITING_APPROVAL, TaskStatus.WAITING_EXTERNAL, TaskStatus.VERIFYING, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.PAUSED}),
    TaskStatus.WAITING_APPROVAL: frozenset({TaskStatus.RUNNING, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.PAUSED}),
    TaskStatus.WAITING_EXTERNAL: frozenset({TaskStatus.RUNNING, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.PAUSED}),
    TaskStatus.VERIFYING: frozenset({TaskStatus.SUCCEEDED, TaskStatus.RUNNING, TaskStatus.FAILED, TaskStatus.WAITING_REVIEW}),
    TaskStatus.WAITING_REVIEW: frozenset({TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED}),
    TaskStatus.PAUSED: frozenset({TaskStatus.RUNNING, TaskStatus.CANCELLED}),
    TaskStatus.SUCCEEDED: frozenset(),
    TaskStatus.FAILED: frozenset(),
    TaskStatus.CANCELLED: frozenset(),
}
TASK_TERMINAL = frozenset(s for s, moves in TASK_TRANSITIONS.items() if not moves)


class Task(models.Model):
    """A task contract and its state. Every change is a compare-and-set on `version`."""

    TRANSITIONS = TASK_TRANSITIONS
    EVENT_ENTITY = Event.Entity.TASK

    task_id = models.CharField(max_length=64, primary_key=True)
    tenant = models.ForeignKey("console.Tenant", on_delete=models.PROTECT, related_name="tasks")
    actor = models.ForeignKey("console.AgentPrincipal", on_delete=models.PROTECT, related_name="tasks")
    task_type = models.CharField(max_length=100)
    goal = models.TextField()
    inputs = models.JSONField(default=dict, blank=True)
    success_criteria = models.JSONField(default=list, blank=True)
    constraints = models.JSONField(default=dict, blank=True)
    versions = models.JSONField(default=dict, blank=True, help_text="workflow, model, prompt, tool schema versions")
    status = models.CharField(max_length=32, choices=TaskStatus.choices, default=TaskStatus.QUEUED)
    version = models.PositiveIntegerField(default=1)
    superseded_by = models.ForeignKey("self", on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    idempotency_key = models.CharField(
        max_length=255, blank=True,
        help_text="The agent's Idempotency-Key (e.g. its framework's thread ID): one task per key and agent.",
    )
    contract_hash = models.CharField(max_length=64, blank=True, help_text="Canonical hash of the contract.")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+",
        help_text="The person who registered the contract, when a person did (empty for an agent's task): "
                  "they may not confirm its success.",
    )
    verdicts = models.JSONField(
        default=list, blank=True,
        help_text="Each success criterion's last verdict and its evidence (runs.verifiers), as the run page shows them.",
    )
    calls_used = models.PositiveIntegerField(default=0)
    writes_used = models.PositiveIntegerField(default=0)
    amount_used = models.DecimalField(max_digits=18, decimal_places=4, default=0)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "status", "updated_at"], name="task_list_idx"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["actor", "idempotency_key"], condition=~models.Q(idempotency_key=""),
                                    name="task_unique_idempotency_key"),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} ({self.status} v{self.version})"


class BudgetCounter(models.Model):
    """What one capped scope spent in one period: a day ("2026-12-01", the tenant's day) of a
    tenant, an agent or a tool, or one task's calls of a tool ("task:<task_id>"). Only kept
    while a cap covers the scope (`approvals.BudgetCap`): a proposal locks the counters that
    bind it, reads them, and writes them with its call in one transaction, so concurrent
    proposals of many tasks never spend past a cap."""

    scope_key = models.CharField(max_length=64, help_text='"tenant:<id>", "agent:<id>" or "tool:<tenant>:<tool>".')
    period = models.CharField(max_length=80, help_text='A day (YYYY-MM-DD) or "task:<task_id>".')
    tenant = models.ForeignKey("console.Tenant", on_delete=models.PROTECT, related_name="+")
    calls = models.PositiveIntegerField(default=0)
    writes = models.PositiveIntegerField(default=0)
    amount = models.DecimalField(max_digits=18, decimal_places=4, default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["scope_key", "period"], name="budget_counter_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.scope_key} {self.period}: {self.calls} calls, {self.writes} writes, {self.amount}"


class Step(models.Model):
    """A logical step of a task, named by the agent. One side-effecting call per step."""

    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="steps")
    step_id = models.CharField(max_length=128)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "step_id"], name="step_unique_per_task"),
        ]
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.task_id}/{self.step_id}"


class Lease(models.Model):
    """Who may drive a task now. The fencing token strictly increases with every new holder;
    only the current token may commit a transition or propose a call."""

    task = models.OneToOneField(Task, on_delete=models.PROTECT, primary_key=True, related_name="lease")
    owner = models.CharField(max_length=160)
    generation = models.PositiveIntegerField(default=1)
    fencing_token = models.PositiveBigIntegerField(default=1)
    expires_at = models.DateTimeField()
    acquired_at = models.DateTimeField(default=timezone.now)

    # Not stored: `runs.services.lease_acquire` sets it on the lease it returns when it took the
    # lease over from an expired holder, so the caller can deal with what that holder left in flight.
    taken_over = False

    def __str__(self) -> str:
        return f"{self.task_id} held by {self.owner} (token {self.fencing_token})"

    def is_live(self, now=None) -> bool:
        return self.expires_at > (now or timezone.now())


class Span(models.Model):
    """One OpenTelemetry span, from an agent's exporter (OTLP) or the console's own tracer.

    Linked to Countersign's records through the attributes `countersign.task_id`,
    `countersign.step_id`, `countersign.operation_id` and `gen_ai.tool.call.id` (on the span or
    its resource). Re-sent batches are idempotent: (tenant, trace, span) is unique.
    """

    class StatusCode(models.TextChoices):
        UNSET = "unset"
        OK = "ok"
        ERROR = "error"

    tenant = models.ForeignKey("console.Tenant", on_delete=models.PROTECT, related_name="spans")
    trace_id = models.CharField(max_length=32)
    span_id = models.CharField(max_length=16)
    parent_span_id = models.CharField(max_length=16, blank=True)
    name = models.CharField(max_length=255)
    kind = models.CharField(max_length=16, blank=True)
    service_name = models.CharField(max_length=255, blank=True)
    start_time = models.DateTimeField()
    end_time = models.DateTimeField()
    duration_ms = models.FloatField()
    status_code = models.CharField(max_length=8, choices=StatusCode.choices, default=StatusCode.UNSET)
    status_message = models.TextField(blank=True)
    attributes = models.JSONField(default=dict, blank=True)
    resource = models.JSONField(default=dict, blank=True)
    events = models.JSONField(default=list, blank=True)
    task = models.ForeignKey(Task, on_delete=models.SET_NULL, null=True, blank=True, related_name="spans")
    step_id = models.CharField(max_length=128, blank=True)
    operation_id = models.CharField(max_length=64, blank=True, db_index=True)
    call_id = models.CharField(max_length=128, blank=True)
    gen_ai_operation = models.CharField(max_length=64, blank=True)
    gen_ai_model = models.CharField(max_length=128, blank=True, help_text="gen_ai.request.model")
    gen_ai_response_model = models.CharField(max_length=128, blank=True, help_text="gen_ai.response.model")
    gen_ai_tool = models.CharField(max_length=128, blank=True)
    input_tokens = models.PositiveIntegerField(null=True, blank=True)
    output_tokens = models.PositiveIntegerField(null=True, blank=True)
    ingested_at = models.DateTimeField(default=timezone.now)
    # What the ingest limits (runs/otlp.py) and the exporter's own SDK left out, as OTLP says it.
    dropped_attributes_count = models.PositiveIntegerField(default=0)
    dropped_events_count = models.PositiveIntegerField(default=0)
    dropped_links_count = models.PositiveIntegerField(default=0, help_text="links are not stored: all are counted")
    truncated_values_count = models.PositiveIntegerField(default=0, help_text="values cut to the length limit")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "trace_id", "span_id"], name="span_unique_per_trace"),
        ]
        indexes = [
            models.Index(fields=["task", "start_time"], name="span_task_idx"),
            models.Index(fields=["tenant", "trace_id"], name="span_trace_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.trace_id[:8]}/{self.span_id})"


class ModelPrice(models.Model):
    """What a model's tokens cost, for the run page's cost per step and the dashboard's cost per
    success. Computed when read, never stored on spans, so a corrected price corrects history.

    A row without a tenant is the list price for everyone; a tenant's own row (a negotiated
    rate, a fine-tuned or self-hosted model) wins over it for that tenant. A price applies from
    `valid_from` until a later row for the same model and scope, so raising a price does not
    reprice last month's runs. Matched on the exact model name: the response model first (the
    model that actually answered, often a dated snapshot), then the requested one; never by
    prefix, since "gpt-4o" is a prefix of "gpt-4o-mini"."""

    tenant = models.ForeignKey("console.Tenant", on_delete=models.CASCADE, null=True, blank=True,
                               related_name="model_prices", help_text="Empty: the list price for every tenant.")
    model = models.CharField(max_length=128, help_text="Exact name as in gen_ai.response.model or gen_ai.request.model.")
    input_per_million = models.DecimalField(max_digits=12, decimal_places=6, help_text="Per million input tokens.")
    output_per_million = models.DecimalField(max_digits=12, decimal_places=6, help_text="Per million output tokens.")
    currency = models.CharField(max_length=3, default="USD", help_text="ISO 4217 code.")
    valid_from = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["model", "tenant_id", "-valid_from"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "model", "valid_from"], name="model_price_unique"),
            models.UniqueConstraint(fields=["model", "valid_from"], condition=models.Q(tenant__isnull=True),
                                    name="model_price_unique_list"),
            models.CheckConstraint(condition=models.Q(input_per_million__gte=0, output_per_million__gte=0),
                                   name="model_price_not_negative"),
        ]

    def __str__(self) -> str:
        scope = self.tenant.slug if self.tenant_id else "list"
        return f"{self.model} ({scope}): {self.input_per_million}/{self.output_per_million} {self.currency} per 1M"


class ReleaseGate(models.Model):
    """A release-gate threshold on one reliability indicator: the dashboard shows a
    pass/fail badge for each enabled gate.

    A gate may be narrowed to one task type, one risk tier and one tool (any of the three), and
    split by any of the three: it is then judged per split (each task type, each tier, each
    tool, or each combination), so a healthy total cannot hide one failing slice. `runs.gates`
    evaluates them; docs/architecture.md ("Release gates") defines each indicator."""

    class Indicator(models.TextChoices):
        SUCCESS_RATE = "terminal_success_rate", "Terminal success rate"
        DUPLICATE_RATE = "duplicate_side_effect_rate", "Duplicate side-effect rate"
        AUTO_RECOVERY_RATE = "automatic_recovery_rate", "Automatic recovery rate"
        RECOVERY_P95 = "recovery_time_p95_seconds", "Recovery time p95 (s)"
        HUMAN_RATE = "human_intervention_rate", "Human intervention rate"
        UNRESOLVED_RATE = "unresolved_rate", "Unresolved (manual) rate"
        RETRY_AMPLIFICATION = "retry_amplification", "Retry amplification"
        LATENCY_AMPLIFICATION = "latency_amplification", "Latency amplification"
        HIGH_RISK_MISEXECUTIONS = "high_risk_misexecutions", "High-risk misexecutions"
        ARGUMENT_VALIDITY = "argument_validity_rate", "Tool-argument validity"
        TIME_P95_CHANGE = "task_time_p95_change", "Task time p95 vs previous release"
        COST_P95_CHANGE = "task_cost_p95_change", "Task cost p95 vs previous release"
        CONTINUATION_RATE = "continuation_rate", "Continuation after a person took over"

    # The indicators `runs.gates` judges per split; the rest only on the whole window.
    SPLITTABLE = frozenset({
        Indicator.SUCCESS_RATE, Indicator.UNRESOLVED_RATE, Indicator.DUPLICATE_RATE, Indicator.RETRY_AMPLIFICATION,
        Indicator.HIGH_RISK_MISEXECUTIONS, Indicator.ARGUMENT_VALIDITY, Indicator.TIME_P95_CHANGE,
        Indicator.COST_P95_CHANGE, Indicator.CONTINUATION_RATE,
    })

    class Comparison(models.TextChoices):
        GTE = "gte", "≥"
        LTE = "lte", "≤"
        LT = "lt", "<"
        GT = "gt", ">"
        EQ = "eq", "="

    indicator = models.CharField(max_length=40, choices=Indicator.choices)
    comparison = models.CharField(max_length=4, choices=Comparison.choices)
    threshold = models.FloatField()
    task_type = models.CharField(max_length=100, blank=True, help_text="Empty: all task types.")
    risk_tier = models.PositiveSmallIntegerField(choices=RiskTier.choices, null=True, blank=True,
                                                 help_text="Empty: all tiers.")
    tool = models.CharField(max_length=100, blank=True, help_text="A tool's name. Empty: all tools.")
    split_by_task_type = models.BooleanField(default=False, help_text="Judge each task type on its own.")
    split_by_risk_tier = models.BooleanField(default=False, help_text="Judge each risk tier on its own.")
    split_by_tool = models.BooleanField(default=False, help_text="Judge each tool on its own.")
    enabled = models.BooleanField(default=True)
    description = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["id"]  # as entered: the defaults in the order of docs/architecture.md

    def __str__(self) -> str:
        scope = "".join(f" [{part}]" for part in self.scope_labels())
        return f"{self.get_indicator_display()} {self.get_comparison_display()} {self.threshold:g}{scope}"

    def scope_labels(self) -> list[str]:
        parts = [self.task_type, f"L{self.risk_tier}" if self.risk_tier is not None else "", self.tool]
        return [part for part in parts if part]

    @property
    def split_words(self) -> str:
        return ", ".join(name.replace("_", " ") for name in self.split_dimensions)

    @property
    def split_dimensions(self) -> tuple[str, ...]:
        """The dimensions the gate is judged per value of, in a fixed order."""
        flags = (("task_type", self.split_by_task_type), ("risk_tier", self.split_by_risk_tier),
                 ("tool", self.split_by_tool))
        return tuple(name for name, on in flags if on)

    def clean(self) -> None:
        narrowed = self.risk_tier is not None or self.tool or self.split_dimensions
        if narrowed and self.indicator not in self.SPLITTABLE:
            raise ValidationError(f"{self.get_indicator_display()} is judged on the whole window only: "
                                  "leave its tier, tool and splits empty.")

    def passes(self, value: float | None) -> bool | None:
        if value is None:
            return None
        return {
            "gte": value >= self.threshold, "lte": value <= self.threshold, "lt": value < self.threshold,
            "gt": value > self.threshold, "eq": value == self.threshold,
        }[self.comparison]


class TenantSpanUsage(models.Model):
    """How many spans a tenant has stored, for its quota (settings.OTLP_TENANT_SPAN_QUOTA), and
    how many were dropped because it was used up. Kept by runs.spans.spans_ingest."""

    tenant = models.OneToOneField("console.Tenant", on_delete=models.CASCADE, primary_key=True,
                                  related_name="span_usage")
    spans = models.BigIntegerField(default=0)
    dropped_over_quota = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.tenant_id}: {self.spans} spans"
