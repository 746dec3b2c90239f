from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render

from console.access import tenant_ids_for
from ledger.models import Event


def home(request: HttpRequest) -> HttpResponse:
    return redirect("dashboard" if request.user.is_authenticated else "login")


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    tenant_ids = tenant_ids_for(request.user)
    events = Event.objects.filter(tenant_id__in=tenant_ids).order_by("-id")[:50]
    last_event_id = events[0].id if events else 0
    return render(request, "console/dashboard.html", {"events": events, "last_event_id": last_event_id})


def healthz(request: HttpRequest) -> JsonResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"ok": True})
