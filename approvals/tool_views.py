"""The tool page: one tool's configuration, the tier rules that gate it, and its recent
operations in the viewer's tenants.

Any person with a role in a tenant may read it (tools are shared configuration, and reviewers
and support staff need to know where a call goes); what it shows of the tool's use is limited to
the viewer's tenants (`approvals.tool_selectors`). Agents and anonymous visitors are refused.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from approvals import tool_selectors
from approvals.models import Tool
from console.access import tenant_ids_for


def _get_tool_for_user(user, tool_name: str) -> tuple[Tool, set[int]]:
    """404 for a person without any tenant, and for a tool that does not exist."""
    tenant_ids = tenant_ids_for(user)
    if not tenant_ids:
        raise Http404("No tenant in which you may see tools.")
    tool = Tool.objects.filter(name=tool_name).first()
    if tool is None:
        raise Http404("No such tool.")
    return tool, tenant_ids


@login_required
def tool_detail(request: HttpRequest, tool_name: str) -> HttpResponse:
    tool, tenant_ids = _get_tool_for_user(request.user, tool_name)
    context = tool_selectors.tool_page(tool, tenant_ids) | {"active_nav": ""}
    return render(request, "approvals/tool.html", context)
