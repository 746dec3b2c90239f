"""The support console: the queue of operations waiting for a person, one operation, and the
actions on it (query the provider, confirm, declare safe to retry, mark failed, escalate,
require compensation).

The rules (who may act, the evidence each action needs, exactly one action counts) live in
`ledger.support`; these views parse the form, call one service, and map its domain errors to
HTTP statuses. Every form works without JavaScript (POST, then redirect); the page follows the
operation live over the "operation" stream.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import NoReverseMatch, reverse
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST

from approvals import audit
from approvals.models import Tool
from console import live as console_live
from console.lib.errors import DomainError, InvalidInput, NotFound, NotPermitted
from console.lib.htmx import wants_fragment
from ledger import control, support
from ledger import support_selectors as selectors
from ledger.compensation import COMPENSABLE, compensation_propose
from ledger.filters import QueueFilterSet
from ledger.forms import CompensatedForm, CompensateForm, ConfirmForm, EscalateForm, ReasonForm
from ledger.models import Operation, OperationStatus
from ledger.support_context import live_detail_context

PAGE_SIZE = 25


def _get_operation_for_user(user, operation_id: str) -> Operation:
    """404 unless the operation is in one of the user's tenants (support, reviewer or admin)."""
    try:
        return support.operation_for_viewer(operation_id=operation_id, user=user)
    except NotFound as exc:
        raise Http404(exc.message) from exc


# ----------------------------------------------------------------------------------- queue


def queue_context(request: HttpRequest) -> dict[str, Any]:
    user = request.user
    filters = QueueFilterSet(request.GET or None, tools=selectors.tool_choices(user))
    # The cursor is read before the rows: an operation arriving in between is both listed and
    # sent by the stream (fragments replace by element id) rather than missed.
    last_event_id = console_live.cursor_for(request.user)
    paginator = Paginator(selectors.queue(user, filters), PAGE_SIZE)
    page = paginator.get_page(request.GET.get("page"))
    counts = selectors.status_counts(user)
    query = request.GET.copy()
    query.pop("page", None)
    return {
        "active_nav": "unknown",
        "form": filters.form,
        "filters": filters,
        "page": page,
        "rows": list(page.object_list),
        "counts": counts,
        "total": sum(counts.values()),
        "figures": selectors.figures(user, counts),
        "query": query.urlencode(),
        "last_event_id": last_event_id,
        # Only the last page receives new arrivals (the queue is oldest first).
        "live_arg": filters.live_arg(**({"more": "1"} if page.has_next() else {})),
    }


@login_required
def unknown(request: HttpRequest) -> HttpResponse:
    if not selectors.viewer_tenant_ids(request.user):
        raise Http404("No tenant in which you may see operations.")
    context = queue_context(request)
    template = "ledger/unknown.html#results" if wants_fragment(request) else "ledger/unknown.html"
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


# ---------------------------------------------------------------------------------- detail


def _task_url(task_id: str) -> str:
    try:
        return reverse("runs:detail", args=[task_id])
    except NoReverseMatch:
        return ""


def _detail_context(request: HttpRequest, operation: Operation, *, forms: dict[str, Any] | None = None,
                    error: str = "", error_action: str = "") -> dict[str, Any]:
    staff = [u.get_username() for u in support.support_staff_of(operation.tenant_id)]
    forms = forms or {}
    context = live_detail_context(request.user, operation)
    context.update({
        "active_nav": "unknown",
        "task": operation.task,
        "task_url": _task_url(operation.task_id),
        "tool": operation.tool,
        "approvals": selectors.approvals_of(operation),
        "confirm_form": forms.get("confirm") or ConfirmForm(),
        "retry_form": forms.get("retry") or ReasonForm(prefix="retry"),
        "fail_form": forms.get("fail") or ReasonForm(prefix="fail"),
        "escalate_form": forms.get("escalate") or EscalateForm(staff=staff),
        "compensate_form": forms.get("compensate") or CompensateForm(
            prefix="compensate", tools=_compensating_tools(operation),
            initial={"arguments": operation.arguments}),
        "compensated_form": forms.get("compensated") or CompensatedForm(prefix="compensated"),
        "can_compensate": operation.status in COMPENSABLE and support.can_act(request.user, operation.tenant_id),
        "can_settle": (operation.status == OperationStatus.COMPENSATION_REQUIRED
                       and support.can_act(request.user, operation.tenant_id)),
        "compensations": list(operation.compensations.select_related("tool").order_by("created_at")),
        "webhook_events": selectors.webhook_events_of(operation),
        "authority_notice": control.authority_notice(operation),
        "audit_review": audit.audit_for_operation(operation.operation_id),
        "error": error,
        "error_action": error_action,
        "last_event_id": console_live.cursor_for(request.user),
    })
    return context


@login_required
def detail(request: HttpRequest, operation_id: str) -> HttpResponse:
    operation = _get_operation_for_user(request.user, operation_id)
    return render(request, "ledger/detail.html", _detail_context(request, operation))


# --------------------------------------------------------------------------------- actions


@login_required
@require_POST
def query_provider(request: HttpRequest, operation_id: str) -> HttpResponse:
    _get_operation_for_user(request.user, operation_id)
    try:
        support.support_request_provider_query(operation_id=operation_id, user=request.user)
    except DomainError as exc:
        return _action_failed(request, operation_id, exc, action="query")
    if wants_fragment(request):
        return render(request, "ledger/detail.html#query_status", {"asked": True})
    messages.info(request, "The provider is being asked; its answer appears on this page.")
    return redirect(reverse("operations:detail", args=[operation_id]))


def _action_failed(request: HttpRequest, operation_id: str, exc: DomainError, *, action: str,
                   form=None) -> HttpResponse:
    if isinstance(exc, NotFound):
        raise Http404(exc.message)
    operation = _get_operation_for_user(request.user, operation_id)
    context = _detail_context(request, operation, forms={action: form} if form is not None else None,
                              error=exc.message, error_action=action)
    return render(request, "ledger/detail.html", context, status=exc.status)


def _run_action(request: HttpRequest, operation_id: str, *, action: str, form, call, done: str) -> HttpResponse:
    """Validate the form, call the one service, redirect (or show the page with the error)."""
    operation = _get_operation_for_user(request.user, operation_id)
    if not support.can_act(request.user, operation.tenant_id):
        return _action_failed(request, operation_id, NotPermitted(
            "You may look at this operation but not act on it: that needs the support role."), action=action)
    if not form.is_valid():
        first = next(iter(form.errors.values()))[0]
        return _action_failed(request, operation_id, InvalidInput(first), action=action, form=form)
    try:
        call(form.cleaned_data)
    except DomainError as exc:
        return _action_failed(request, operation_id, exc, action=action, form=form)
    messages.success(request, done)
    return redirect(reverse("operations:detail", args=[operation_id]))


@login_required
@require_POST
def confirm(request: HttpRequest, operation_id: str) -> HttpResponse:
    return _run_action(
        request, operation_id, action="confirm", form=ConfirmForm(request.POST), done="Confirmed with the receipt.",
        call=lambda d: support.support_confirm(operation_id=operation_id, user=request.user,
                                               remote_id=d["remote_id"], reason=d["reason"]))


@login_required
@require_POST
def retry(request: HttpRequest, operation_id: str) -> HttpResponse:
    return _run_action(
        request, operation_id, action="retry", form=ReasonForm(request.POST, prefix="retry"),
        done="Declared safe to retry: the dispatch is queued with the same operation ID and key.",
        call=lambda d: support.support_mark_retry_safe(operation_id=operation_id, user=request.user,
                                                       reason=d["reason"]))


@login_required
@require_POST
def fail(request: HttpRequest, operation_id: str) -> HttpResponse:
    return _run_action(
        request, operation_id, action="fail", form=ReasonForm(request.POST, prefix="fail"),
        done="Marked failed: the provider has no effect.",
        call=lambda d: support.support_fail(operation_id=operation_id, user=request.user, reason=d["reason"]))


@login_required
@require_POST
def escalate(request: HttpRequest, operation_id: str) -> HttpResponse:
    operation = _get_operation_for_user(request.user, operation_id)
    staff = [u.get_username() for u in support.support_staff_of(operation.tenant_id)]
    return _run_action(
        request, operation_id, action="escalate", form=EscalateForm(request.POST, staff=staff),
        done="Escalated.",
        call=lambda d: support.support_escalate(operation_id=operation_id, user=request.user,
                                                assignee=d["assignee"], reason=d["reason"]))


@login_required
@require_POST
def compensate(request: HttpRequest, operation_id: str) -> HttpResponse:
    operation = _get_operation_for_user(request.user, operation_id)
    return _run_action(
        request, operation_id, action="compensate",
        form=CompensateForm(request.POST, prefix="compensate", tools=_compensating_tools(operation)),
        done="Compensating operation proposed; it waits for another reviewer's approval (not yours).",
        call=lambda d: compensation_propose(operation_id=operation_id, user=request.user, tool_name=d["tool"],
                                            arguments=d["arguments"], reason=d["reason"]))


@login_required
@require_POST
def compensated(request: HttpRequest, operation_id: str) -> HttpResponse:
    return _run_action(
        request, operation_id, action="compensated", form=CompensatedForm(request.POST, prefix="compensated"),
        done="Marked compensated, with your evidence.",
        call=lambda d: support.support_mark_compensated(operation_id=operation_id, user=request.user,
                                                        evidence=d["evidence"], reason=d["reason"]))


def _compensating_tools(operation: Operation) -> list[str]:
    """The enabled tools the original tool's compensation rule names."""
    names = sorted(operation.tool.compensation_rule or {})
    return list(Tool.objects.filter(enabled=True, name__in=names).order_by("name").values_list("name", flat=True))
