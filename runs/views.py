"""Runs: the list of tasks and one run's contract, steps, trace waterfall, operations and
approvals, live while the run is active."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils import timezone

from approvals.models import ApprovalRequest
from console.access import tenant_ids_for
from console.live import cursor_for
from console.models import Event, Tenant
from ledger import control
from ledger.models import Operation
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
        "task": task, "summary": summary, "spans": payload(rows, costs), "span_count": total,
        "cursor": cursor, "limit": MAX_SPANS,
        "operations": operations, "approvals": approvals, "events": events,
        "active": _following(task),
    }


@login_required
def run_detail(request: HttpRequest, task_id: str) -> HttpResponse:
    task = _get_task_for_user(request, task_id)
    context = run_detail_context(task) | {"active_nav": "runs", "last_event_id": cursor_for(request.user),
                                          "can_control": control.may_control_task(request.user, task.tenant_id)}
    return render(request, "runs/detail.html", context)


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
