"""Runs: the list of tasks and one run's contract, steps, trace waterfall, operations and
approvals, live while the run is active."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from approvals.models import ApprovalRequest
from console.access import tenant_ids_for
from console.lib.errors import DomainError, NotFound
from console.live import cursor_for
from console.models import Event, Role, Tenant
from ledger import control
from ledger.models import Operation
from runs import services, verifiers
from runs.models import TASK_TERMINAL, Task, TaskStatus
from runs.pricing import PriceBook
from runs.waterfall import MAX_SPANS, payload, summarize, trace_rows, trace_state

PAGE_SIZE = 50
SINCE = {"1h": timedelta(hours=1), "24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}


def _get_task_for_user(request: HttpRequest, task_id: str) -> Task:
    task = Task.objects.select_related("tenant", "actor").filter(
        task_id=task_id, tenant_id__in=tenant_ids_for(request.user)
    ).first()
    if task is None:
        raise Http404("No such run in your tenants.")
    return task


@login_required
def run_list(request: HttpRequest) -> HttpResponse:
    tenant_ids = tenant_ids_for(request.user)
    tasks = Task.objects.filter(tenant_id__in=tenant_ids).select_related("tenant")
    status = request.GET.get("status", "")
    task_type = request.GET.get("type", "")
    tenant = request.GET.get("tenant", "")
    window = request.GET.get("since", "")
    query = request.GET.get("q", "").strip()
    if status in TaskStatus.values:
        tasks = tasks.filter(status=status)
    if task_type:
        tasks = tasks.filter(task_type=task_type)
    if tenant.isdigit():
        tasks = tasks.filter(tenant_id=int(tenant))  # already limited to the user's tenants
    if window in SINCE:
        tasks = tasks.filter(updated_at__gte=timezone.now() - SINCE[window])
    if query:
        # A task ID, or the call or operation ID of one of its calls.
        tasks = tasks.filter(
            Q(task_id=query) | Q(calls__call_id=query) | Q(operations__operation_id=query)
        ).distinct()
    tasks = tasks.annotate(
        operation_count=Count("operations", distinct=True),
    ).order_by("-updated_at", "-task_id")
    page = Paginator(tasks, PAGE_SIZE).get_page(request.GET.get("page"))
    types = (Task.objects.filter(tenant_id__in=tenant_ids)
             .values_list("task_type", flat=True).distinct().order_by("task_type"))
    context = {
        "page": page, "status": status, "task_type": task_type, "q": query, "types": list(types),
        "tenant": tenant, "tenants": list(Tenant.objects.filter(id__in=tenant_ids).order_by("name")),
        "since": window, "windows": list(SINCE), "statuses": TaskStatus.values, "active_nav": "runs",
    }
    template = "runs/list.html#results" if request.htmx and not request.htmx.boosted else "runs/list.html"
    return render(request, template, context)


# Exporters batch (OpenTelemetry's default: every 5 s), so a run's last spans arrive after it ended.
SPANS_AFTER_END = timedelta(seconds=60)


def _following(task: Task) -> bool:
    """Whether an open page should keep asking for new spans."""
    return task.status not in TASK_TERMINAL or timezone.now() - task.updated_at < SPANS_AFTER_END


def run_detail_context(task: Task) -> dict:
    rows = trace_rows(task)
    summary, costs = summarize(task, rows, PriceBook.for_tenants([task.tenant_id]))
    total, cursor = trace_state(task) if len(rows) >= MAX_SPANS else (len(rows), max((r.id for r in rows), default=0))
    operations = list(Operation.objects.filter(task=task).select_related("tool", "step").order_by("created_at"))
    approvals = list(ApprovalRequest.objects.filter(task=task).select_related("tool").order_by("created_at"))
    # The same events the live stream appends (runs/live.py): the task's, its operations', its approvals'.
    events = list(Event.objects.filter(
        Q(entity=Event.Entity.TASK, entity_id=task.task_id)
        | Q(entity=Event.Entity.OPERATION, entity_id__in=[op.operation_id for op in operations])
        | Q(entity=Event.Entity.APPROVAL, entity_id__in=[a.approval_id for a in approvals])
    ).order_by("id"))
    return {
        "task": task, "criteria_rows": verifiers.criteria_rows(task),
        "summary": summary, "spans": payload(rows, costs), "span_count": total,
        "cursor": cursor, "limit": MAX_SPANS,
        "operations": operations, "approvals": approvals, "events": events,
        "active": _following(task),
    }


def detail_page_context(request: HttpRequest, task: Task, **extra) -> dict:
    """The run page's whole context for this viewer (what they may control and review)."""
    return run_detail_context(task) | {
        "active_nav": "runs", "last_event_id": cursor_for(request.user),
        "can_control": control.may_control_task(request.user, task.tenant_id),
        "may_review": task.status == TaskStatus.WAITING_REVIEW and services.may_review_success(request.user, task),
        "registered_it": task.created_by_id is not None and task.created_by_id == request.user.pk,
    } | extra


@login_required
def run_detail(request: HttpRequest, task_id: str) -> HttpResponse:
    task = _get_task_for_user(request, task_id)
    return render(request, "runs/detail.html", detail_page_context(request, task))


REVIEW_DONE = {"confirm": "Success confirmed: the task succeeded.", "reject": "Success rejected: the task failed."}


@login_required
@require_POST
def run_review(request: HttpRequest, task_id: str, decision: str) -> HttpResponse:
    """A reviewer confirms or rejects the task's human success criteria, with evidence."""
    task = _get_task_for_user(request, task_id)
    if decision not in REVIEW_DONE:
        raise Http404("No such decision.")
    evidence = request.POST.get("evidence", "")
    return act_on_run(
        request, task, lambda: services.task_review_decide(task_id=task.task_id, user=request.user,
                                                           decision=decision, evidence=evidence),
        done=REVIEW_DONE[decision], error_key="review_error", review_evidence=evidence)


def act_on_run(request: HttpRequest, task: Task, act: Callable[[], object], *, done: str, error_key: str,
               **error_context) -> HttpResponse:
    """One action from the run page: done, a message and back to the page; refused, the page
    again with the error under `error_key`, at the error's status."""
    try:
        act()
    except DomainError as exc:
        if isinstance(exc, NotFound):
            raise Http404(exc.message) from exc
        task.refresh_from_db()
        page = detail_page_context(request, task, **{error_key: exc.message}, **error_context)
        return render(request, "runs/detail.html", page, status=exc.status)
    messages.success(request, done)
    return redirect(reverse("runs:detail", args=[task.task_id]))


@login_required
def review_list(request: HttpRequest) -> HttpResponse:
    """Tasks waiting for a success review, in the tenants where the user reviews."""
    tenant_ids = tenant_ids_for(request.user, Role.REVIEWER)
    tasks = (Task.objects.filter(tenant_id__in=tenant_ids, status=TaskStatus.WAITING_REVIEW)
             .select_related("tenant", "actor").order_by("updated_at", "task_id"))
    page = Paginator(tasks, PAGE_SIZE).get_page(request.GET.get("page"))
    rows = [{"task": task, "human": [v for v in task.verdicts if v.get("result") == "review"],
             "registered_it": task.created_by_id is not None and task.created_by_id == request.user.pk}
            for task in page.object_list]
    return render(request, "runs/reviews.html", {"page": page, "rows": rows, "active_nav": "reviews",
                                                 "is_reviewer": bool(tenant_ids)})


def _int_param(request: HttpRequest, name: str) -> int:
    raw = request.GET.get(name, "0")
    return int(raw) if raw.isdigit() else 0


@login_required
def run_trace(request: HttpRequest, task_id: str) -> HttpResponse:
    """The spans of the run's traces the page has not seen (row id above `after`), the refreshed
    per-step summary, and the count the page should now hold. 204 when nothing arrived."""
    task = _get_task_for_user(request, task_id)
    after, known = _int_param(request, "after"), _int_param(request, "known")
    total, cursor = trace_state(task)
    active = _following(task)
    if (total, cursor) == (known, after) and active:
        return HttpResponse(status=204)
    rows = trace_rows(task)
    summary, costs = summarize(task, rows, PriceBook.for_tenants([task.tenant_id]))
    new = [(row, cost) for row, cost in zip(rows, costs, strict=True) if row.id > after]
    return JsonResponse({
        "spans": payload([row for row, _ in new], [cost for _, cost in new]),
        "cursor": max(cursor, after), "total": total, "limit": MAX_SPANS, "active": active,
        "summary": render_to_string("runs/_trace_summary.html", {"summary": summary, "span_count": total},
                                    request=request),
    })
