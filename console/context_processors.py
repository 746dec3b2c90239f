from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.urls import NoReverseMatch, reverse

from console.access import layout_roles
from console.models import Role

# (key, label, URL name, roles that see it; empty: anyone with a role)
NAVIGATION = [
    ("approvals", "Approvals", "approvals:inbox", {Role.REVIEWER, Role.ADMIN}),
    ("audit", "Audit", "audit:list", {Role.REVIEWER, Role.ADMIN}),
    ("unknown", "Unknown outcomes", "operations:unknown", {Role.SUPPORT, Role.REVIEWER, Role.ADMIN}),
    ("runs", "Runs", "runs:list", set()),
    ("reviews", "Success reviews", "runs:reviews", {Role.REVIEWER}),
    ("dashboard", "Dashboard", "dashboard", set()),
    ("stops", "Stops", "stops:page", {Role.ADMIN, Role.REVIEWER}),
]


def navigation(request) -> dict:
    """The navigation shown by role; pages not installed yet are left out. Only people have
    roles: a page reached with an agent's token (the API docs) has no navigation."""
    user = getattr(request, "user", None)
    if not isinstance(user, AbstractBaseUser) or not user.is_authenticated:
        return {"nav_items": []}
    roles = layout_roles(user)
    items = []
    for key, label, url_name, allowed in NAVIGATION:
        if not roles or (allowed and not roles & allowed):
            continue
        try:
            items.append((key, label, reverse(url_name)))
        except NoReverseMatch:
            continue
    if user.is_staff:
        items.append(("admin", "Admin", reverse("admin:index")))
    return {"nav_items": items, "user_roles": sorted(roles)}
