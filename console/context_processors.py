from __future__ import annotations

from console.access import roles_of
from console.models import Role


def navigation(request) -> dict:
    """The navigation shown by role: reviewers see Approvals, support sees Unknown outcomes."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"nav_items": []}
    roles = roles_of(user)
    items = []
    if roles & {Role.REVIEWER, Role.ADMIN}:
        items.append(("approvals", "Approvals", "/approvals/"))
    if roles & {Role.SUPPORT, Role.REVIEWER, Role.ADMIN}:
        items.append(("unknown", "Unknown outcomes", "/operations/unknown/"))
    if roles:
        items.append(("runs", "Runs", "/runs/"))
        items.append(("dashboard", "Dashboard", "/dashboard/"))
    if user.is_staff:
        items.append(("admin", "Admin", "/admin/"))
    return {"nav_items": items, "user_roles": sorted(roles)}
