from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import RequestDataTooBig
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views import defaults

from approvals import audit
from console.access import roles_of, tenant_ids_for
from console.api import error_body, for_machines
from console.models import Event, RiskTier, Role
from ledger.liveness import liveness_report
from runs import gates, metrics
from runs.models import Task

WINDOWS = {"1h": timedelta(hours=1), "24h": timedelta(hours=24), "7d": timedelta(days=7)}


def home(request: HttpRequest) -> HttpResponse:
    return redirect("dashboard" if request.user.is_authenticated else "login")


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    tenant_ids = tenant_ids_for(request.user)
    window = request.GET.get("window", "24h")
    window = window if window in WINDOWS else "24h"
    task_type = request.GET.get("type", "")
    tier_raw = request.GET.get("tier", "")
    tier = int(tier_raw) if tier_raw.isdigit() and int(tier_raw) in RiskTier.values else None
    since = timezone.now() - WINDOWS[window]
    indicators = metrics.compute(tenant_ids=tenant_ids, since=since, task_type=task_type, tier=tier)
    gate_results, releases = gates.evaluate(tenant_ids=tenant_ids, since=since, task_type=task_type, tier=tier,
                                            release=request.GET.get("release", ""), fallback=indicators)
    events = Event.objects.filter(tenant_id__in=tenant_ids).order_by("-id")[:50]
    context = {
        "indicators": indicators,
        "gates": gate_results, "releases": releases,
        "chart": metrics.series(tenant_ids=tenant_ids, since=since, task_type=task_type, tier=tier),
        "trials": {"k": list(indicators.pass_at_k), "pass_at_k": list(indicators.pass_at_k.values()),
                   "pass_hat_k": [indicators.pass_hat_k.get(k) for k in indicators.pass_at_k]},
        "events": events,
        "last_event_id": events[0].id if events else 0,
        "window": window, "windows": list(WINDOWS), "task_type": task_type, "tier": tier_raw,
        "types": list(Task.objects.filter(tenant_id__in=tenant_ids).values_list("task_type", flat=True)
                      .distinct().order_by("task_type")),
        "tiers": RiskTier.choices,
        "active_nav": "dashboard",
        # Workers serve every tenant: their panel is for staff and tenant admins only.
        **_audit_today(request.user),
        "liveness": liveness_report() if request.user.is_staff or Role.ADMIN in roles_of(request.user) else None,
    }
    return render(request, "console/dashboard.html", context)


def _audit_today(user) -> dict:
    """Audited calls per day in the tenants where the user reviews or administers (the audit
    list's readers): today's counts and a small plot of the last two weeks."""
    tenant_ids = tenant_ids_for(user, Role.REVIEWER, Role.ADMIN)
    if not tenant_ids:
        return {"audit": None}
    days = audit.audit_days(tenant_ids)
    return {"audit": {"today": days[-1], "backlog": audit.audit_backlog(tenant_ids), "bars": audit.audit_plot(days),
                      "width": len(days) * audit.BAR_STEP, "height": audit.PLOT_HEIGHT}}


def healthz(request: HttpRequest) -> JsonResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"ok": True})


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    if not for_machines(request):
        return defaults.bad_request(request, exception)
    if isinstance(exception, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return JsonResponse(error_body("too_large", f"The body is larger than {limit} bytes.",
                                       {"limit_bytes": limit}), status=413)
    return JsonResponse(error_body("invalid", "The request is invalid."), status=400)


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if not for_machines(request):
        return defaults.page_not_found(request, exception)
    return JsonResponse(error_body("not_found", f"No such endpoint: {request.path}"), status=404)
