"""Runs: the list of tasks and one run's contract, steps, trace waterfall, operations and
approvals, live while the run is active."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count, Max, Q, Sum
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from approvals.models import ApprovalRequest
from console.access import tenant_ids_for
from console.live import latest_event_id
from ledger.models import Event, Operation
from runs.models import TASK_TERMINAL, Span, Task, TaskStatus
from runs.waterfall import build_waterfall

PAGE_SIZE = 50
MAX_SPANS = 5000


def _get_task_for_user(request: HttpRequest, task_id: str) -> Task:
    task = Task.objects.select_related("tenant", "actor").filter(
        task_id=task_id, tenant_id__in=tenant_ids_for(request.user)
    ).first()
    if task is None:
        raise Http404("No such run in your tenants.")
    return task


@login_required
def run_list(request: HttpRequest) -> HttpResponse:
    tasks = Task.objects.filter(tenant_id__in=tenant_ids_for(request.user)).select_related("tenant")
    status = request.GET.get("status", "")
    task_type = request.GET.get("type", "")
    query = request.GET.get("q", "").strip()
    if status in TaskStatus.values:
        tasks = tasks.filter(status=status)
    if task_type:
        tasks = tasks.filter(task_type=task_type)
    if query:
        # A task ID, or the call or operation ID of one of its calls.
        tasks = tasks.filter(
            Q(task_id=query) | Q(calls__call_id=query) | Q(operations__operation_id=query)
        ).distinct()
    tasks = tasks.annotate(
        operation_count=Count("operations", distinct=True),
    ).order_by("-updated_at", "-task_id")
    page = Paginator(tasks, PAGE_SIZE).get_page(request.GET.get("page"))
    types = (Task.objects.filter(tenant_id__in=tenant_ids_for(request.user))
             .values_list("task_type", flat=True).distinct().order_by("task_type"))
    context = {
        "page": page, "status": status, "task_type": task_type, "q": query, "types": list(types),
        "statuses": TaskStatus.values, "active_nav": "runs",
    }
    template = "runs/list.html#results" if request.htmx and not request.htmx.boosted else "runs/list.html"
    return render(request, template, context)


# The waterfall's columns only: attributes, resource and events are large and unused here.
WATERFALL_FIELDS = ("trace_id", "span_id", "parent_span_id", "name", "start_time", "end_time", "duration_ms",
                    "status_code", "gen_ai_model", "step_id")


def _trace_spans(task: Task):
    return Span.objects.filter(tenant_id=task.tenant_id,
                               trace_id__in=Span.objects.filter(task=task).values("trace_id"))


def trace_version(task: Task) -> str:
    """Changes whenever a span of the run's traces arrives: the page re-renders only then."""
    stats = _trace_spans(task).aggregate(n=Count("id"), last=Max("id"))
    return f"{stats['n']}-{stats['last'] or 0}"


def run_detail_context(task: Task) -> dict:
    spans = list(_trace_spans(task).only(*WATERFALL_FIELDS).order_by("start_time")[:MAX_SPANS])
    steps = (
        Span.objects.filter(task=task).exclude(step_id="").values("step_id")
        .annotate(spans=Count("id"), input_tokens=Sum("input_tokens"), output_tokens=Sum("output_tokens"),
                  latency_ms=Sum("duration_ms"), errors=Count("id", filter=Q(status_code="error")))
        .order_by("step_id")
    )
    operations = list(Operation.objects.filter(task=task).select_related("tool", "step").order_by("created_at"))
    approvals = list(ApprovalRequest.objects.filter(task=task).order_by("created_at"))
    events = list(Event.objects.filter(entity="task", entity_id=task.task_id).order_by("id"))
    return {
        "task": task, "waterfall": build_waterfall(spans), "span_count": len(spans), "steps": list(steps),
        "trace_version": trace_version(task),
        "operations": operations, "approvals": approvals, "events": events,
        "active": task.status not in TASK_TERMINAL,
    }


@login_required
def run_detail(request: HttpRequest, task_id: str) -> HttpResponse:
    task = _get_task_for_user(request, task_id)
    if request.htmx and request.GET.get("trace_version") == trace_version(task):
        return HttpResponse(status=204)  # nothing new: htmx keeps the waterfall it has
    context = run_detail_context(task) | {"active_nav": "runs", "last_event_id": latest_event_id()}
    template = "runs/detail.html#trace" if request.htmx else "runs/detail.html"
    return render(request, template, context)
