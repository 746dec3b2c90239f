"""Default release gates, installed by the embedded run command and the demo; and
the demo fleet's model price, so a newcomer sees cost per step at once."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from runs.models import ModelPrice, ReleaseGate

Ind, C = ReleaseGate.Indicator, ReleaseGate.Comparison

BY_TYPE, BY_TIER, BY_TOOL = {"split_by_task_type": True}, {"split_by_risk_tier": True}, {"split_by_tool": True}

# (indicator, comparison, threshold, description, splits). The seven release gates first, each
# judged per slice where one slice could hide behind the rest (docs/architecture.md, "Release gates").
DEFAULT_GATES = [
    (Ind.SUCCESS_RATE, C.GTE, 0.95, "Core task success rate ≥ 95%, per task type", BY_TYPE),
    (Ind.HIGH_RISK_MISEXECUTIONS, C.EQ, 0.0, "No L3/L4 operation ran without authority or other than approved",
     BY_TIER),
    (Ind.UNRESOLVED_RATE, C.LT, 0.001, "Unrecoverable operations < 0.1%", {}),
    (Ind.ARGUMENT_VALIDITY, C.GTE, 0.995, "Tool arguments valid ≥ 99.5%, per tool", BY_TOOL),
    (Ind.TIME_P95_CHANGE, C.LTE, 0.10, "Task time p95 regresses ≤ 10% against the previous release", BY_TYPE),
    (Ind.COST_P95_CHANGE, C.LTE, 0.15, "Task cost p95 regresses ≤ 15% against the previous release", BY_TYPE),
    (Ind.CONTINUATION_RATE, C.GTE, 0.99, "Tasks continue after a person took over ≥ 99%", {}),
    (Ind.DUPLICATE_RATE, C.EQ, 0.0, "Zero duplicate side effects", {}),
    (Ind.AUTO_RECOVERY_RATE, C.GTE, 0.9, "Most unknown outcomes recover without a person", {}),
    (Ind.RETRY_AMPLIFICATION, C.LTE, 1.5, "No retry storms: ≤ 1.5 attempts per operation", {}),
]


def ensure_release_gates() -> None:
    """Installs each default gate that has no unscoped row yet; a gate an operator edited
    (threshold, splits) is left as it is."""
    for indicator, comparison, threshold, description, splits in DEFAULT_GATES:
        ReleaseGate.objects.get_or_create(
            indicator=indicator, task_type="", risk_tier=None, tool="",
            defaults={"comparison": comparison, "threshold": threshold, "description": description, **splits},
        )


def ensure_demo_prices() -> None:
    """A list price for the demo fleet's fictional `demo-model` (console/management/commands/
    demo_fleet.py). Real models' prices are the operator's to enter in the admin: a price list
    shipped in code would be out of date the day a vendor changes it."""
    if not ModelPrice.objects.filter(model="demo-model", tenant__isnull=True).exists():
        ModelPrice.objects.create(model="demo-model", input_per_million=Decimal("1.00"),
                                  output_per_million=Decimal("4.00"), currency="USD",
                                  valid_from=datetime(2026, 1, 1, tzinfo=UTC))
