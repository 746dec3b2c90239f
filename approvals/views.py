"""The reviewer console: the inbox, one request, and the two decisions.

The rules (tenant, maximum tier, two distinct approvers for L4, expiry, already decided, the
arguments a reviewer saw) live in `approvals.services`; these views only call them and map their
domain errors to HTTP statuses.

Inbox decision: requests above the reviewer's maximum tier are listed too, marked "needs L4
reviewer", so nobody wonders where they went, but they carry no decision controls (the detail
page explains instead). Decisions are made on the detail page only, where the arguments, the
preview and the task contract are in view; the form carries the arguments hash the reviewer saw.
"""

from __future__ import annotations

import csv
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST

from approvals import selectors
from approvals.filters import InboxFilterSet
from approvals.forms import ApproveForm, ArgumentsForm, RejectForm
from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from approvals.renderers import InboxFormRenderer
from approvals.selectors import ReviewerScope, decorate_rows, review_context
from console import live as console_live
from console.lib.errors import Conflict, DomainError, InvalidInput, NotFound
from console.lib.htmx import wants_fragment
from console.lib.reveal import hidden_characters
from ledger import decisions
from ledger.adapters import adapter_for
from runs.pricing import PriceBook
from runs.waterfall import MAX_SPANS, payload, summarize, trace_rows

PAGE_SIZE = 25
FORM_RENDERER = InboxFormRenderer()


def _get_approval_for_user(user, approval_id: str, scope: ReviewerScope | None = None) -> ApprovalRequest:
    """404 unless the request is in one of the user's reviewer (or admin) tenants: an outsider
    learns nothing, not even that the ID exists."""
    scope = scope or selectors.reviewer_scope(user)
    approval = selectors.approval_for_user(user, scope, approval_id)
    if approval is None:
        raise Http404("No such approval request.")
    return approval


# ----------------------------------------------------------------------------------- inbox


@login_required
def inbox(request: HttpRequest) -> HttpResponse:
    scope = selectors.reviewer_scope(request.user)
    filters = InboxFilterSet(request.GET or None, **selectors.filter_choices(scope))
    filters.form.renderer = FORM_RENDERER
    active = filters.active()
    # The cursor is read before the rows: a request created in between is then both listed and
    # sent by the stream (the page de-duplicates by row id) rather than missed.
    last_event_id = console_live.cursor_for(request.user, frozenset(scope.tenant_ids))
    counts = selectors.tier_counts(scope)
    ids = selectors.inbox_ids(scope, filters)
    paginator = Paginator(ids, PAGE_SIZE)
    first: list[str] | None = None
    if set(active) <= {"tier"}:
        # The per-tier counts already say how many rows there are: no second COUNT(*).
        paginator.count = counts.get(active["tier"], 0) if "tier" in active else sum(counts.values())
    elif request.GET.get("page") in (None, "", "1"):
        # Page 1 of a filtered list: its IDs (and one more) first; a list that fits on the page
        # is its own count (a search by ID scans every pending request once, not twice).
        first = list(ids[:PAGE_SIZE + 1])
        if len(first) <= PAGE_SIZE:
            paginator.count = len(first)
    page = paginator.get_page(request.GET.get("page"))
    if first is not None and page.number == 1:
        page.object_list = first[:PAGE_SIZE]
    rows = decorate_rows(selectors.inbox_rows(request.user, list(page.object_list)), scope)
    query = request.GET.copy()
    query.pop("page", None)
    context: dict[str, Any] = {
        "active_nav": "approvals",
        "form": filters.form,
        "filters": filters,
        "page": page,
        # 10,000 pending requests are 400 pages: link the first, last and nearby ones only.
        "page_range": list(paginator.get_elided_page_range(page.number, on_each_side=2, on_ends=1)),
        "ellipsis": Paginator.ELLIPSIS,
        "rows": rows,
        "counts": counts,
        "total": sum(counts.values()),
        "max_tier": scope.highest_tier(),
        "query": query.urlencode(),
        "last_event_id": last_event_id,
        "live_arg": filters.live_arg(**({"page": page.number} if page.number != 1 else {})),
    }
    template = "approvals/inbox.html#results" if wants_fragment(request) else "approvals/inbox.html"
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


# ---------------------------------------------------------------------------------- detail


def _preview(approval: ApprovalRequest) -> dict[str, Any] | None:
    """The adapter's preview of the call, when the tool has one and the request's tier shows
    previews (`_preview_off` says when the tier hides one)."""
    tool = approval.operation.tool
    if not tool.has_preview or not selectors.tier_shows_preview(approval.risk_tier):
        return None
    try:
        preview = adapter_for(tool).preview(approval.operation.arguments)
    except LookupError:
        return None
    preview = selectors.masked_preview(preview, tool.secret_fields)
    if preview and isinstance(preview.get("to"), list):
        preview["to"] = ", ".join(str(a) for a in preview["to"])
    return preview


def _detail_context(request: HttpRequest, scope: ReviewerScope, approval: ApprovalRequest, *,
                    approve_form: ApproveForm | None = None, reject_form: RejectForm | None = None,
                    error: str = "", error_field: str = "", notice: str = "") -> dict[str, Any]:
    operation = approval.operation
    task = approval.task
    tool = operation.tool
    context = review_context(request.user, scope, approval)
    arguments = selectors.masked_arguments(operation.arguments, tool.secret_fields)
    preview = _preview(approval)
    # The tool could show one, the tier's policy hides it: the page says so rather than leave
    # the reviewer to wonder where the preview went.
    preview_off = tool.has_preview and preview is None and not selectors.tier_shows_preview(approval.risk_tier)
    constraints = [(k, *selectors.display_value(v)) for k, v in (task.constraints or {}).items()]
    success_criteria = [
        selectors.display_value(c)[0]
        for c in (task.success_criteria if isinstance(task.success_criteria, list) else [task.success_criteria])
    ]
    inputs = selectors.display_value(task.inputs)[0] if task.inputs else ""
    # Everything on the page that came from the agent: the reviewer is warned once, at the top,
    # if any of it holds characters that are not visible as themselves (the preview is made from
    # the arguments, so its characters are counted there).
    shown = [f"{row['name']}{row['text']}" for row in arguments] + [
        task.goal, inputs, *success_criteria, *(f"{name}{text}" for name, text, _ in constraints)]
    context.update({
        "active_nav": "approvals",
        "task": task,
        "tool": tool,
        "arguments": arguments,
        "preview": preview,
        "preview_off": preview_off,
        "constraints": constraints,
        "success_criteria": success_criteria,
        "inputs": inputs,
        "hidden_characters": sum(len(hidden_characters(text)) for text in shown),
        "version_moved": task.version != approval.state_version,
        "approve_form": approve_form or ApproveForm(initial={"arguments_hash": approval.arguments_hash}),
        "reject_form": reject_form or RejectForm(),
        "error": error,
        "notice": notice,
        "error_field": error_field,
        "last_event_id": console_live.cursor_for(request.user, frozenset(scope.tenant_ids)),
        "notifications": selectors.notifications_for(approval.approval_id),
        "edited_from": selectors.edited_from(approval.approval_id),
        "can_edit": context["can_decide"] and bool((tool.json_schema or {}).get("properties")),
        **_trace_so_far(task),
    })
    return context


def _trace_so_far(task) -> dict[str, Any]:
    """The task's spans up to now, drawn read-only by the run page's waterfall (runs/waterfall.py
    reads them; static/runs/waterfall.js draws them)."""
    rows = trace_rows(task)
    summary, costs = summarize(task, rows, PriceBook.for_tenants([task.tenant_id]))
    return {"trace_spans": payload(rows, costs), "trace_summary": summary, "trace_span_count": len(rows),
            "trace_limit": MAX_SPANS}


@login_required
def detail(request: HttpRequest, approval_id: str) -> HttpResponse:
    scope = selectors.reviewer_scope(request.user)
    approval = _get_approval_for_user(request.user, approval_id, scope)
    return render(request, "approvals/detail.html", _detail_context(request, scope, approval))


# ------------------------------------------------------------------------------- decisions


def _conflict_message(approval: ApprovalRequest, exc: DomainError) -> str:
    """"Already approved by senior at 12:03" rather than a bare status."""
    if approval.status == ApprovalStatus.PENDING:
        if approval.expires_at <= timezone.now():
            return "This request has expired; it can no longer be decided."
        return exc.message
    decisions = [d for d in selectors.decisions_for_operation(approval.operation_id) if d.request_id == approval.pk]
    verdict = {ApprovalStatus.APPROVED: "approve", ApprovalStatus.REJECTED: "reject"}.get(approval.status)
    names = [d.reviewer.get_username() for d in decisions if d.verdict == verdict]
    when = timezone.localtime(approval.decided_at).strftime("%H:%M:%S") if approval.decided_at else ""
    if names:
        return f"Already {approval.status} by {' and '.join(names)}" + (f" at {when} UTC." if when else ".")
    return f"This request is already {approval.status}."


def _after_decision(request: HttpRequest, approval_id: str, *, status: int = 200,
                    approve_form: ApproveForm | None = None, reject_form: RejectForm | None = None,
                    error: str = "", error_field: str = "", notice: str = "") -> HttpResponse:
    scope = selectors.reviewer_scope(request.user)
    approval = _get_approval_for_user(request.user, approval_id, scope)
    context = _detail_context(request, scope, approval, approve_form=approve_form, reject_form=reject_form,
                              error=error, error_field=error_field, notice=notice)
    template = "approvals/detail.html#review" if wants_fragment(request) else "approvals/detail.html"
    return render(request, template, context, status=status)


def _domain_error(request: HttpRequest, approval_id: str, exc: DomainError, **forms) -> HttpResponse:
    if isinstance(exc, NotFound):
        raise Http404(exc.message)
    message = exc.message
    if isinstance(exc, Conflict):
        approval = ApprovalRequest.objects.filter(pk=approval_id).first()
        if approval is not None:
            message = _conflict_message(approval, exc)
    field = exc.details.get("field", "") if isinstance(exc, InvalidInput) else ""
    return _after_decision(request, approval_id, status=exc.status, error=message, error_field=field, **forms)


@login_required
@require_POST
def approve(request: HttpRequest, approval_id: str) -> HttpResponse:
    before = _get_approval_for_user(request.user, approval_id)
    form = ApproveForm(request.POST)
    form.is_valid()
    data = getattr(form, "cleaned_data", {})
    try:
        after = decisions.approval_approve(
            approval_id=approval_id, reviewer=request.user, reason=(data.get("reason") or "").strip(),
            arguments_hash=data.get("arguments_hash") or None,
        )
    except DomainError as exc:
        return _domain_error(request, approval_id, exc, approve_form=form)
    if wants_fragment(request):
        return _after_decision(request, approval_id, notice=_approval_recorded(before, after))
    messages.success(request, _approval_recorded(before, after))
    return redirect(reverse("approvals:detail", args=[approval_id]))


def _approval_recorded(before: ApprovalRequest, after: ApprovalRequest) -> str:
    """What the reviewer is told: recorded, how many of how many while more are needed, and
    that the policy asks more now when approving raised the request."""
    if after.status != ApprovalStatus.PENDING:
        return "Your approval is recorded."
    given = after.decisions.filter(verdict=ApprovalDecision.Verdict.APPROVE).count()
    message = f"Your approval is recorded ({given} of {after.approvals_needed})"
    if (after.risk_tier, after.approvals_needed) != (before.risk_tier, before.approvals_needed):
        message += (f"; the policy now requires L{after.risk_tier}, {after.approvals_needed} approval(s) (the request "
                    f"was filed at L{before.risk_tier}, {before.approvals_needed}), so the call is not authorized yet")
    return message + "."


@login_required
@require_POST
def reject(request: HttpRequest, approval_id: str) -> HttpResponse:
    _get_approval_for_user(request.user, approval_id)
    form = RejectForm(request.POST)
    form.is_valid()
    data = getattr(form, "cleaned_data", {})
    try:
        decisions.approval_reject(
            approval_id=approval_id, reviewer=request.user, reason=(data.get("reason") or "").strip(),
        )
    except DomainError as exc:
        return _domain_error(request, approval_id, exc, reject_form=form)
    if wants_fragment(request):
        return _after_decision(request, approval_id)
    messages.success(request, "The request is rejected.")
    return redirect(reverse("approvals:detail", args=[approval_id]))


# --------------------------------------------------------------------------- edit and approve


def _arguments_form(approval: ApprovalRequest, data=None) -> ArgumentsForm:
    tool = approval.operation.tool
    return ArgumentsForm(data, schema=tool.json_schema, current=approval.operation.arguments,
                         secret_fields=tool.secret_fields,
                         initial={"arguments_hash": approval.arguments_hash})


@login_required
def edit(request: HttpRequest, approval_id: str) -> HttpResponse:
    """GET: the arguments as a form generated from the tool's schema. POST: approve the edited
    call — a new call, operation and request through the gate (`approval_edit_and_approve`)."""
    scope = selectors.reviewer_scope(request.user)
    approval = _get_approval_for_user(request.user, approval_id, scope)
    context = review_context(request.user, scope, approval)
    status = 200
    if request.method == "POST":
        form = _arguments_form(approval, request.POST)
        if form.is_valid():
            arguments = form.arguments()
        if form.is_valid():  # arguments() may have added parse errors
            try:
                result = decisions.approval_edit_and_approve(
                    approval_id=approval_id, reviewer=request.user, arguments=arguments,
                    reason=form.cleaned_data.get("reason") or "",
                    arguments_hash=form.cleaned_data.get("arguments_hash") or None,
                )
            except DomainError as exc:
                if isinstance(exc, NotFound):
                    raise Http404(exc.message) from exc
                if isinstance(exc, InvalidInput) and exc.details.get("errors"):
                    form.add_schema_errors(exc.details["errors"])
                elif isinstance(exc, InvalidInput) and exc.details.get("field") == "reason":
                    form.add_error("reason", exc.message)
                else:
                    form.add_error(None, exc.message)
                status = exc.status
            else:
                if result.new is not None:
                    messages.success(request, f"Edited call {result.call_id} created and approved by you "
                                              f"(L{result.new.risk_tier}); the original request is superseded.")
                    return redirect(reverse("approvals:detail", args=[result.new.approval_id]))
                messages.success(request, f"Edited call {result.call_id} runs without approval at its new tier; "
                                          "the original request is superseded.")
                return redirect(reverse("approvals:detail", args=[approval_id]))
        else:
            status = 400
    else:
        form = _arguments_form(approval)
    context.update({"active_nav": "approvals", "form": form, "tool": approval.operation.tool,
                    "task": approval.task})
    return render(request, "approvals/edit.html", context, status=status)


# ------------------------------------------------------------------------------------ export


def _export_decisions(request: HttpRequest):
    scope = selectors.reviewer_scope(request.user)
    filters = InboxFilterSet(request.GET or None, **selectors.filter_choices(scope))
    return selectors.decisions_for_export(scope, filters)


def _csv_cell(value: Any) -> Any:
    # Reasons and call IDs are typed by people and agents: a leading = + - @ would be a
    # formula in a spreadsheet (CSV injection), so it is quoted as text.
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


class _Echo:
    def write(self, value: str) -> str:
        return value


@login_required
def export_csv(request: HttpRequest) -> StreamingHttpResponse:
    decisions = _export_decisions(request)
    writer = csv.writer(_Echo())

    def rows():
        yield writer.writerow(selectors.EXPORT_FIELDS)
        for decision in decisions.iterator(chunk_size=500):
            row = selectors.export_row(decision)
            yield writer.writerow([_csv_cell(row[name]) for name in selectors.EXPORT_FIELDS])

    response = StreamingHttpResponse(rows(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="approval-decisions.csv"'
    return response


@login_required
def export_json(request: HttpRequest) -> JsonResponse:
    decisions = [selectors.export_row(d) for d in _export_decisions(request).iterator(chunk_size=500)]
    response = JsonResponse({"decisions": decisions, "count": len(decisions)})
    response["Content-Disposition"] = 'attachment; filename="approval-decisions.json"'
    return response
