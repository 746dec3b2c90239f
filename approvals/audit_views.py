"""The audit review list: calls run at once under an audited tier, for reviewers to mark
reviewed or flag with a note (the rules are in `approvals.audit`; these views call it)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from approvals import audit, selectors
from approvals.models import AuditReview, AuditStatus
from approvals.selectors import ReviewerScope
from console.lib.errors import DomainError, NotFound

PAGE_SIZE = 50


def _status_filter(value: str | None) -> str:
    return value if value in audit.LIST_FILTERS else AuditStatus.UNREVIEWED


def _render(request: HttpRequest, scope: ReviewerScope, status: str, *, error: str = "", error_id: str = "",
            http_status: int = 200) -> HttpResponse:
    paginator = Paginator(audit.audit_entries(scope.tenant_ids, status), PAGE_SIZE)
    page = paginator.get_page(request.GET.get("page"))
    rows = list(page.object_list)
    for row in rows:
        row.proposed_by_me = row.proposed_by_id is not None and row.proposed_by_id == request.user.pk
        row.can_review = row.status == AuditStatus.UNREVIEWED and audit.may_review(
            request.user, row, max_tier=scope.max_tier.get(row.tenant_id))
    by_status = dict(AuditReview.objects.filter(tenant_id__in=scope.tenant_ids).order_by().values("status")
                     .annotate(n=Count("pk")).values_list("status", "n"))
    context: dict[str, Any] = {
        "active_nav": "audit",
        "rows": rows,
        "page": page,
        "status": status,
        "tabs": [(name, sum(by_status.values()) if name == "all" else by_status.get(name, 0))
                 for name in audit.LIST_FILTERS],
        "max_tier": scope.highest_tier(),
        "error": error,
        "error_id": error_id,
    }
    return render(request, "approvals/audit.html", context, status=http_status)


@login_required
def audit_list(request: HttpRequest) -> HttpResponse:
    scope = selectors.reviewer_scope(request.user)
    return _render(request, scope, _status_filter(request.GET.get("status")))


@login_required
@require_POST
def audit_review(request: HttpRequest, audit_id: str) -> HttpResponse:
    scope = selectors.reviewer_scope(request.user)
    # 404 unless the entry is in one of the user's reviewer (or admin) tenants.
    if not AuditReview.objects.filter(pk=audit_id, tenant_id__in=scope.tenant_ids).exists():
        raise Http404("No such audited call.")
    back = _status_filter(request.POST.get("back"))
    verdict = request.POST.get("verdict", "")
    try:
        entry = audit.audit_review(operation_id=audit_id, reviewer=request.user, verdict=verdict,
                                   note=request.POST.get("note", ""))
    except DomainError as exc:
        if isinstance(exc, NotFound):
            raise Http404(exc.message) from exc
        return _render(request, scope, back, error=exc.message, error_id=audit_id, http_status=exc.status)
    messages.success(request, f"Call {entry.call_id} is {entry.status}.")
    return redirect(reverse("audit:list") + f"?status={back}")
