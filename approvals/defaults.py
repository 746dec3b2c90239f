"""The default tier policy and the seeded tools (docs/architecture.md), installed idempotently by the
embedded run command, the demo and the tests — never by a migration, so production starts empty."""

from __future__ import annotations

from django.db import transaction

from approvals.models import EscalationRule, PolicyTier, Tool

DEFAULT_TIERS = [
    # level, requirement, preview, description
    (0, PolicyTier.Requirement.RUN, False, "Runs at once."),
    (1, PolicyTier.Requirement.RUN_AUDIT, False, "Runs at once; audited."),
    (2, PolicyTier.Requirement.ONE_APPROVAL, True, "One approval; the reviewer sees a preview."),
    (3, PolicyTier.Requirement.ONE_APPROVAL, False, "One approval."),
    (4, PolicyTier.Requirement.TWO_APPROVALS, False, "Two distinct approvers."),
]

REFUND_SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "minLength": 1, "maxLength": 100},
        "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000000},
        "currency": {"type": "string", "enum": ["EUR", "USD", "GBP", "CNY"]},
        "reason": {"type": "string", "minLength": 1, "maxLength": 500},
    },
    "required": ["order_id", "amount", "currency", "reason"],
    "additionalProperties": False,
}

# A header-bound field holds no line break (header injection) and no other control character.
# Said as "no match anywhere" rather than an anchored pattern: Python's `$` also matches before a
# final newline, so "^[^...]*$" would let "Subject\n" through.
HEADER_TEXT = {"not": {"pattern": "[\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029]"}}

MAIL_SCHEMA = {
    "type": "object",
    "properties": {
        # "email" is strict here: exactly one plain mailbox per entry (approvals/formats.py).
        "to": {"type": "array", "items": {"type": "string", "format": "email", "maxLength": 254},
               "minItems": 1, "maxItems": 20},
        "subject": {"type": "string", "minLength": 1, "maxLength": 200, **HEADER_TEXT},
        "body": {"type": "string", "minLength": 1, "maxLength": 20000},
    },
    "required": ["to", "subject", "body"],
    "additionalProperties": False,
}

LOOKUP_SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string", "minLength": 1, "maxLength": 100}},
    "required": ["order_id"],
    "additionalProperties": False,
}

DEFAULT_TOOLS = [
    dict(
        name="orders.lookup", adapter="orders.lookup", description="Read an order (read-only).",
        json_schema=LOOKUP_SCHEMA, base_tier=1, kind=Tool.Kind.READ, idempotency=Tool.Idempotency.NONE,
        queue=Tool.Queue.FAST, timeout_seconds=5, retryable_errors=["rate_limited", "unavailable", "connect"],
        max_attempts=3,
    ),
    dict(
        name="payments.refund", adapter="payments.refund",
        description="Refund (part of) an order through the payments provider.",
        json_schema=REFUND_SCHEMA, base_tier=1, kind=Tool.Kind.WRITE, idempotency=Tool.Idempotency.NATIVE,
        business_key="order_id", queue=Tool.Queue.FAST, timeout_seconds=5,
        retryable_errors=["rate_limited", "unavailable", "connect"], max_attempts=4,
        compensation_rule={"payments.refund": {"order_id": "same", "currency": "same", "amount": "at_most"}},
    ),
    dict(
        name="mail.send", adapter="mail.send", description="Send an email (SMTP).",
        json_schema=MAIL_SCHEMA, base_tier=2, kind=Tool.Kind.WRITE, idempotency=Tool.Idempotency.QUERY,
        has_preview=True, queue=Tool.Queue.SLOW, timeout_seconds=5,
        retryable_errors=["rate_limited", "unavailable", "connect"], max_attempts=4,
        compensation_rule={"mail.send": {"to": "same"}},
    ),
]

DEFAULT_RULES = [
    ("payments.refund", "amount", EscalationRule.Comparison.GT, 50, 3, "Refunds over 50 need a reviewer."),
    ("payments.refund", "amount", EscalationRule.Comparison.GT, 200, 4, "Refunds over 200 need two reviewers."),
]


@transaction.atomic
def ensure_policy_defaults() -> None:
    for level, requirement, preview, description in DEFAULT_TIERS:
        PolicyTier.objects.get_or_create(
            level=level, defaults={"requirement": requirement, "shows_preview": preview, "description": description}
        )
    for spec in DEFAULT_TOOLS:
        spec = dict(spec)
        tool, created = Tool.objects.get_or_create(name=spec.pop("name"), defaults=spec)
        if not created and not tool.compensation_rule and spec.get("compensation_rule"):
            # A database seeded before tools had compensation rules gets the default one.
            Tool.objects.filter(pk=tool.pk).update(compensation_rule=spec["compensation_rule"])
    for tool_name, path, comparison, value, tier, description in DEFAULT_RULES:
        EscalationRule.objects.get_or_create(
            tool=Tool.objects.get(name=tool_name), argument_path=path, comparison=comparison, value=value,
            defaults={"tier": tier, "description": description},
        )
