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
    return roles_from(user, Membership.objects.filter(user=user).values_list("role", flat=True))


def roles_from(user: AbstractBaseUser, membership_roles) -> set[str]:
    """The user's roles given the roles of all their memberships (a superuser is an admin)."""
    roles = set(membership_roles)
    if user.is_superuser:
        roles.add(Role.ADMIN)
    return roles


# The layout shows the user's roles and the navigation they allow on every page. A page that has
# already read all of the user's memberships (approvals.selectors.reviewer_scope) leaves the
# roles on the request's user object, as Django's auth backend keeps its permission cache there,
# and the layout does not read them a second time.
_REMEMBERED_ROLES = "_countersign_roles"


def remember_roles(user: AbstractBaseUser, roles: set[str]) -> None:
    setattr(user, _REMEMBERED_ROLES, frozenset(roles))


def layout_roles(user: AbstractBaseUser) -> set[str]:
    """The roles for the layout: those remembered during this request, else read now. Never for
    a permission check, which reads them itself."""
    remembered = getattr(user, _REMEMBERED_ROLES, None)
    return set(remembered) if remembered is not None else roles_of(user)
