"""Prometheus metrics for operators: gauges read from the ledger at scrape time."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from approvals.models import ApprovalRequest, ApprovalStatus
from console.models import Event
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
        last = Event.objects.order_by("-id").values_list("id", flat=True).first() or 0
        yield GaugeMetricFamily("countersign_last_event_id", "Highest event id (grows with every change)",
                                value=last)


def metrics(request: HttpRequest) -> HttpResponse:
    """Only with `Authorization: Bearer $METRICS_TOKEN`; off while no token is set.

    The counters cover every tenant: an operator's view, so neither a tenant's session nor an
    agent's token opens it, and neither does the client's address (behind a reverse proxy on
    the same machine every request comes from loopback)."""
    token = settings.METRICS_TOKEN
    if not token:
        return HttpResponse("metrics are off: set METRICS_TOKEN and scrape with it as a bearer token\n",
                            status=403, content_type="text/plain")
    header = request.headers.get("Authorization", "")
    if not hmac.compare_digest(header.encode(), f"Bearer {token}".encode()):
        return HttpResponse("metrics token required\n", status=401, content_type="text/plain",
                            headers={"WWW-Authenticate": 'Bearer realm="metrics"'})
    registry = CollectorRegistry()
    registry.register(LedgerCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
