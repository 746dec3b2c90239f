"""Default release gates (seed 003), installed by the embedded run command and the demo."""

from __future__ import annotations

from runs.models import ReleaseGate

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
