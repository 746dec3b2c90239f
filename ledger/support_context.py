"""What the support console's operation page shows of an operation as it moves: built for the page
(ledger/views.py) and again by its live stream (ledger/live.py) when an event touches it."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser

from ledger import support
from ledger import support_selectors as selectors
from ledger.forms import ReasonForm
from ledger.models import Operation


def live_detail_context(user: AbstractBaseUser, operation: Operation) -> dict[str, Any]:
    """What the live stream re-renders: status, provider answers, evidence, timeline."""
    operation.refresh_from_db()
    answers = selectors.provider_answers(operation)
    return {
        "operation": operation,
        "is_resolvable": operation.status in support.RESOLVABLE,
        "can_act": support.can_act(user, operation.tenant_id),
        "answers": answers,
        "evidence": support.no_effect_evidence(operation, answers[0] if answers else None),
        "timeline": selectors.timeline(operation),
        "attempts": selectors.attempts(operation),
        "assignee": selectors.assignee_of(operation),
        "resolved_by": None if operation.status in support.RESOLVABLE else support.resolved_by(operation.operation_id),
        # The evidence panel (re-rendered live) carries the retry and fail forms.
        "retry_form": ReasonForm(prefix="retry"),
        "fail_form": ReasonForm(prefix="fail"),
    }
