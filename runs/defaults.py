"""Default release gates, installed by the embedded run command and the demo; and
the demo fleet's model price, so a newcomer sees cost per step at once."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from runs.models import ModelPrice, ReleaseGate

Ind, C = ReleaseGate.Indicator, ReleaseGate.Comparison

DEFAULT_GATES = [
    (Ind.SUCCESS_RATE, C.GTE, 0.95, "Core task success rate ≥ 95%"),
    (Ind.DUPLICATE_RATE, C.EQ, 0.0, "Zero duplicate side effects"),
    (Ind.UNRESOLVED_RATE, C.LT, 0.001, "Unrecoverable operations < 0.1%"),
    (Ind.AUTO_RECOVERY_RATE, C.GTE, 0.9, "Most unknown outcomes recover without a person"),
    (Ind.RETRY_AMPLIFICATION, C.LTE, 1.5, "No retry storms: ≤ 1.5 attempts per operation"),
]


def ensure_release_gates() -> None:
    for indicator, comparison, threshold, description in DEFAULT_GATES:
        ReleaseGate.objects.get_or_create(
            indicator=indicator, task_type="",
            defaults={"comparison": comparison, "threshold": threshold, "description": description},
        )


def ensure_demo_prices() -> None:
    """A list price for the demo fleet's fictional `demo-model` (console/management/commands/
    demo_fleet.py). Real models' prices are the operator's to enter in the admin: a price list
    shipped in code would be out of date the day a vendor changes it."""
    if not ModelPrice.objects.filter(model="demo-model", tenant__isnull=True).exists():
        ModelPrice.objects.create(model="demo-model", input_per_million=Decimal("1.00"),
                                  output_per_million=Decimal("4.00"), currency="USD",
                                  valid_from=datetime(2026, 1, 1, tzinfo=UTC))
