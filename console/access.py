"""Who may see and do what: roles per tenant, reviewers' maximum tiers."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser

from console.models import Membership, Role


def tenant_ids_for(user: AbstractBaseUser, *roles: str) -> set[int]:
    """Tenants in which the user holds any of `roles` (any role when none is given)."""
    if not user.is_authenticated:
        return set()
    qs = Membership.objects.filter(user=user)
    if roles:
        qs = qs.filter(role__in=roles)
    return set(qs.values_list("tenant_id", flat=True))


def reviewer_max_tier(user: AbstractBaseUser, tenant_id: int) -> int | None:
    """The highest tier this user may approve in the tenant, or None if not a reviewer there."""
    if not user.is_authenticated or not user.is_active:
        return None
    tiers = Membership.objects.filter(
        user=user, tenant_id=tenant_id, role=Role.REVIEWER
    ).values_list("max_tier", flat=True)
    tiers = [t for t in tiers if t is not None]
    return max(tiers) if tiers else None


def roles_of(user: AbstractBaseUser) -> set[str]:
    if not user.is_authenticated:
        return set()
    roles = set(Membership.objects.filter(user=user).values_list("role", flat=True))
    if user.is_superuser:
        roles.add(Role.ADMIN)
    return roles
