"""Template helpers for naming a tool: where its calls go."""

from __future__ import annotations

from django import template

from approvals.models import Tool
from approvals.tools import upstream_of

register = template.Library()


@register.filter
def upstream(tool: Tool) -> str:
    """The host, MCP server or "built-in" a call of this tool goes to."""
    return upstream_of(tool)
