"""For operators: Prometheus metrics (gauges read from the ledger at scrape time) and the workers'
liveness as JSON (`/healthz/workers`, the same verdict as `manage.py worker_health`). Both are
open on loopback and elsewhere need `Authorization: Bearer $METRICS_TOKEN`."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from approvals.models import ApprovalRequest, ApprovalStatus
from console.api import DRF_CODES, error_body
from console.models import Event
from ledger.liveness import liveness_report
from ledger.models import Operation
from runs.models import Task


class LedgerCollector:
    def collect(self):
        operations = GaugeMetricFamily("countersign_operations", "Operations by status and tool",
                                       labels=["status", "tool"])
        for row in Operation.objects.values("status", "tool__name").annotate(n=Count("operation_id")):
            operations.add_metric([row["status"], row["tool__name"]], row["n"])
        yield operations
        tasks = GaugeMetricFamily("countersign_tasks", "Tasks by status", labels=["status"])
        for row in Task.objects.values("status").annotate(n=Count("task_id")):
            tasks.add_metric([row["status"]], row["n"])
        yield tasks
        pending = GaugeMetricFamily("countersign_approvals_pending", "Pending approval requests by tier",
                                    labels=["tier"])
        for row in ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING).values("risk_tier").annotate(
                n=Count("approval_id")):
            pending.add_metric([f"L{row['risk_tier']}"], row["n"])
        yield pending
        report = liveness_report()
        yield GaugeMetricFamily("countersign_oldest_due_operation_seconds",
                                "How long the oldest operation due for a worker has waited (0: none due)",
                                value=report.oldest_due_seconds or 0.0)
        progress = GaugeMetricFamily("countersign_worker_progress_age_seconds",
                                     "Seconds since each live worker last finished a task", labels=["worker"])
        for worker in report.live_workers:
            if worker.progressed_seconds_ago is not None:
                progress.add_metric([worker.name], worker.progressed_seconds_ago)
        yield progress
        yield GaugeMetricFamily("countersign_stalled", "1 when due work waits and no worker progresses",
                                value=int(report.stalled))
        last = Event.objects.order_by("-id").values_list("id", flat=True).first() or 0
        yield GaugeMetricFamily("countersign_last_event_id", "Highest event id (grows with every change)",
                                value=last)


def _operator_refusal(request: HttpRequest) -> tuple[int, str] | None:
    """(status, message) when the request may not read operator data; None when it may."""
    token = settings.METRICS_TOKEN
    if token:
        if not hmac.compare_digest(request.headers.get("Authorization", ""), f"Bearer {token}"):
            return 401, "metrics token required"
    elif request.META.get("REMOTE_ADDR") not in ("127.0.0.1", "::1"):
        return 403, "set METRICS_TOKEN to read this from elsewhere"
    return None


def metrics(request: HttpRequest) -> HttpResponse:
    """Open on loopback; elsewhere only with `Authorization: Bearer $METRICS_TOKEN`."""
    refused = _operator_refusal(request)
    if refused:
        return HttpResponse(f"{refused[1]}\n", status=refused[0], content_type="text/plain")
    registry = CollectorRegistry()
    registry.register(LedgerCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def worker_health(request: HttpRequest) -> JsonResponse:
    """The liveness verdict for a probe: 200 when a worker is alive and the ledger moves, 503
    when no worker is alive or due work waits with no progress (ledger/liveness.py)."""
    if request.method != "GET":
        return JsonResponse(error_body("method_not_allowed", "Use GET."), status=405)
    refused = _operator_refusal(request)
    if refused:
        return JsonResponse(error_body(DRF_CODES[refused[0]], refused[1]), status=refused[0])
    report = liveness_report()
    return JsonResponse(report.as_dict(), status=200 if report.healthy else 503)
