"""Who is asking: tenants, the roles of people in them, and agent principals with API tokens."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models


class RiskTier(models.IntegerChoices):
    L0 = 0, "L0"
    L1 = 1, "L1"
    L2 = 2, "L2"
    L3 = 3, "L3"
    L4 = 4, "L4"


class Tenant(models.Model):
    slug = models.SlugField(unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.slug


class Role(models.TextChoices):
    REVIEWER = "reviewer", "Reviewer"
    SUPPORT = "support", "Support"
    ADMIN = "admin", "Admin"


class Membership(models.Model):
    """A person's role in one tenant. A person may hold several roles (one row each)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)
    max_tier = models.PositiveSmallIntegerField(
        choices=RiskTier.choices, null=True, blank=True,
        help_text="Reviewers only: the highest risk tier this person may approve.",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant", "role"], name="membership_unique_role"),
        ]

    def __str__(self) -> str:
        return f"{self.user} {self.role} @ {self.tenant}"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class AgentPrincipal(models.Model):
    """An agent identity in one tenant. Only the SHA-256 of its bearer token is stored."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="agents")
    name = models.CharField(max_length=100)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    token_prefix = models.CharField(max_length=8, editable=False, help_text="First characters, to tell tokens apart.")
    allowed_tools = models.ManyToManyField("approvals.Tool", blank=True, related_name="agents")
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="agent_unique_name_per_tenant"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant}/{self.name}"

    @property
    def ref(self) -> str:
        """How this principal appears in events and intent hashes."""
        return f"agent:{self.tenant.slug}/{self.name}"

    # Django's auth machinery asks these of request.user.
    is_authenticated = True
    is_anonymous = False

    def set_token(self, token: str | None = None) -> str:
        token = token or "cs_" + secrets.token_urlsafe(32)
        self.token_hash = hash_token(token)
        self.token_prefix = token[:8]
        return token
