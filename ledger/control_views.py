"""The stop buttons (`/stops/`) and a task's cancel, pause and resume on its run page.

Each POST checks who is asking (the services check the role again), calls one service and
redirects; an error re-renders the page with the message and the error's status."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseClientRedirect

from approvals import stops
from approvals.models import Stop, StopStatus, Tool
from console.access import tenant_ids_for
from console.lib.errors import DomainError, InvalidInput, NotFound
from console.lib.htmx import wants_fragment
from console.live import cursor_for
from console.models import AgentPrincipal, Tenant
from ledger import control
from runs.models import Task
from runs.views import act_on_run

HISTORY = 30


def _stop_context(request: HttpRequest, *, error: str = "", form: dict[str, str] | None = None) -> dict[str, Any]:
    tenant_ids = tenant_ids_for(request.user)
    tenants = []
    for tenant in Tenant.objects.filter(pk__in=tenant_ids).order_by("slug"):
        may_all = stops.may_stop(request.user, tenant_id=tenant.pk, scope=Stop.Scope.TENANT)
        may_tools = may_all or stops.may_stop(request.user, tenant_id=tenant.pk, scope=Stop.Scope.TOOL)
        tenants.append({
            "tenant": tenant, "may_all": may_all, "may_tools": may_tools,
            "agents": list(AgentPrincipal.objects.filter(tenant=tenant).order_by("name")) if may_all else [],
        })
    return {
        "active_nav": "stops",
        "tenants": tenants,
        "may_stop_any": any(t["may_tools"] for t in tenants),
        "may_stop_agents": any(t["may_all"] for t in tenants),
        "tools": list(Tool.objects.order_by("name")),
        "in_force": stops_in_force(tenant_ids, request.user),
        "history": list(Stop.objects.filter(tenant_id__in=tenant_ids).select_related(
            "tenant", "agent", "tool", "stopped_by", "resumed_by")[:HISTORY]),
        "error": error,
        "form": form or {},
        "last_event_id": cursor_for(request.user),
    }


def stops_in_force(tenant_ids, user) -> list[dict[str, Any]]:
    rows = Stop.objects.filter(tenant_id__in=tenant_ids, status=StopStatus.STOPPED).select_related(
        "tenant", "agent", "tool", "stopped_by")
    return [{"stop": stop, "may_resume": stops.may_stop(user, tenant_id=stop.tenant_id, scope=stop.scope)}
            for stop in rows]


@login_required
def stops_page(request: HttpRequest) -> HttpResponse:
    if not tenant_ids_for(request.user):
        raise Http404("You have no role in any tenant.")
    return render(request, "ledger/stops.html", _stop_context(request))


def _failed(request: HttpRequest, exc: DomainError, form: dict[str, str] | None = None) -> HttpResponse:
    if isinstance(exc, NotFound):
        raise Http404(exc.message)
    return render(request, "ledger/stops.html", _stop_context(request, error=exc.message, form=form),
                  status=exc.status)


def _pk(value: str, model, **scope):
    if not value.isdigit():
        raise InvalidInput(f"Choose a {model._meta.verbose_name}.")
    found = model.objects.filter(pk=int(value), **scope).first()
    if found is None:
        raise NotFound(f"No such {model._meta.verbose_name}.")
    return found


@login_required
@require_POST
def stop_create(request: HttpRequest) -> HttpResponse:
    form = {key: request.POST.get(key, "").strip() for key in ("tenant", "scope", "agent", "tool", "reason")}
    try:
        tenant = _pk(form["tenant"], Tenant, pk__in=tenant_ids_for(request.user))
        scope = form["scope"]
        agent = _pk(form["agent"], AgentPrincipal, tenant=tenant) if scope == Stop.Scope.AGENT else None
        tool = _pk(form["tool"], Tool) if scope == Stop.Scope.TOOL else None
        stop = stops.stop_create(tenant_id=tenant.pk, scope=scope, agent=agent, tool=tool, user=request.user,
                                 reason=form["reason"])
    except DomainError as exc:
        return _failed(request, exc, form)
    messages.success(request, f"Stopped {stop.describe()}.")
    return redirect(reverse("stops:page"))


@login_required
@require_POST
def stop_resume(request: HttpRequest, stop_id: str) -> HttpResponse:
    visible = Stop.objects.filter(pk=stop_id, tenant_id__in=tenant_ids_for(request.user)).exists()
    if not visible:
        raise Http404("No such stop in your tenants.")
    try:
        stop = control.stop_resume(stop_id=stop_id, user=request.user, reason=request.POST.get("reason", ""))
    except DomainError as exc:
        if wants_fragment(request):  # htmx swaps no error page: show it on the reloaded page
            messages.error(request, exc.message)
            return HttpResponseClientRedirect(reverse("stops:page"))
        return _failed(request, exc)
    messages.success(request, f"Resumed {stop.describe()}; what it held is dispatched again.")
    if wants_fragment(request):
        return HttpResponseClientRedirect(reverse("stops:page"))
    return redirect(reverse("stops:page"))


# ------------------------------------------------------------------------------- run page

TASK_ACTIONS = {"cancel": control.task_cancel, "pause": control.task_pause, "resume": control.task_resume}
DONE = {"cancel": "Task cancelled; its waiting approvals are closed and nothing more is sent.",
        "pause": "Task paused; its operations are held until it is resumed.",
        "resume": "Task resumed; what the pause held is dispatched again."}


@login_required
@require_POST
def task_control(request: HttpRequest, task_id: str, action: str) -> HttpResponse:
    task = Task.objects.select_related("tenant", "actor").filter(
        task_id=task_id, tenant_id__in=tenant_ids_for(request.user)).first()
    if task is None or action not in TASK_ACTIONS:
        raise Http404("No such run in your tenants.")
    return act_on_run(
        request, task, lambda: TASK_ACTIONS[action](task_id=task_id, user=request.user,
                                                    reason=request.POST.get("reason", "")),
        done=DONE[action], error_key="control_error", control_action=action)
