"""For operators: Prometheus metrics (gauges read from the ledger at scrape time) and the workers'
liveness as JSON (`/healthz/workers`, the same verdict as `manage.py worker_health`). Both need
`Authorization: Bearer $METRICS_TOKEN` and are off while no token is set."""

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
from runs.models import Task, TenantSpanUsage


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
        stored = GaugeMetricFamily("countersign_tenant_spans", "Spans a tenant has stored (its quota's usage)",
                                   labels=["tenant"])
        dropped = GaugeMetricFamily("countersign_tenant_spans_dropped_over_quota",
                                    "Spans dropped because the tenant's span quota was used up", labels=["tenant"])
        for slug, spans, over in TenantSpanUsage.objects.values_list("tenant__slug", "spans", "dropped_over_quota"):
            stored.add_metric([slug], spans)
            dropped.add_metric([slug], over)
        yield stored
        yield dropped
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
    """(status, message) when the request may not read operator data; None when it may.

    Only `Authorization: Bearer $METRICS_TOKEN` opens it; off while no token is set. The data
    covers every tenant: an operator's view, so neither a tenant's session nor an agent's token
    opens it, and neither does the client's address (behind a reverse proxy on the same
    machine every request comes from loopback)."""
    token = settings.METRICS_TOKEN
    if not token:
        return 403, "off: set METRICS_TOKEN and send it as a bearer token"
    header = request.headers.get("Authorization", "")
    if not hmac.compare_digest(header.encode(), f"Bearer {token}".encode()):
        return 401, "metrics token required"
    return None


def metrics(request: HttpRequest) -> HttpResponse:
    """Only with `Authorization: Bearer $METRICS_TOKEN`; off while no token is set."""
    refused = _operator_refusal(request)
    if refused:
        headers = {"WWW-Authenticate": 'Bearer realm="metrics"'} if refused[0] == 401 else None
        return HttpResponse(f"{refused[1]}\n", status=refused[0], content_type="text/plain", headers=headers)
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
