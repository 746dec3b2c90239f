"""Demo identities (the README lists them): embedded mode and tests only."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from approvals.defaults import ensure_policy_defaults
from approvals.models import Tool
from console.models import AgentPrincipal, Membership, Role, Tenant, hash_token
from runs.defaults import ensure_demo_prices, ensure_release_gates

DEMO_USERS = [
    # username, roles, reviewer max tier, superuser
    ("admin", [Role.ADMIN, Role.REVIEWER, Role.SUPPORT], 4, True),
    ("reviewer", [Role.REVIEWER], 3, False),
    ("senior", [Role.REVIEWER], 4, False),
    ("support", [Role.SUPPORT], None, False),
]


@transaction.atomic
def ensure_demo_data() -> AgentPrincipal:
    if not settings.EMBEDDED:
        raise ImproperlyConfigured("Demo identities are created only in embedded mode.")
    ensure_policy_defaults()
    ensure_release_gates()
    ensure_demo_prices()
    tenant, _ = Tenant.objects.get_or_create(slug="acme", defaults={"name": "Acme Corp"})
    User = get_user_model()
    for username, roles, max_tier, superuser in DEMO_USERS:
        user, created = User.objects.get_or_create(username=username, defaults={"email": f"{username}@acme.test"})
        if created or not user.check_password(settings.DEMO_PASSWORD):
            user.set_password(settings.DEMO_PASSWORD)
        user.is_staff = user.is_superuser = superuser
        user.save()
        for role in roles:
            Membership.objects.update_or_create(
                user=user, tenant=tenant, role=role,
                defaults={"max_tier": max_tier if role == Role.REVIEWER else None},
            )
    agent = AgentPrincipal.objects.filter(tenant=tenant, name="demo-agent").first()
    if agent is None:
        agent = AgentPrincipal(tenant=tenant, name="demo-agent")
    if agent.token_hash != hash_token(settings.DEMO_AGENT_TOKEN):
        agent.set_token(settings.DEMO_AGENT_TOKEN)
    agent.save()
    agent.allowed_tools.set(Tool.objects.all())
    return agent
