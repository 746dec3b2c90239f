"""First set-up of a deployment, in either mode, idempotently: migrations, the default tiers,
tools, escalation rules and release gates, one tenant, its first admin and, if asked, one agent.

Never the demo identities (`seed_demo` is for embedded mode). Running it again changes nothing
that exists: a present admin keeps their password, a present agent keeps its token.
"""

from __future__ import annotations

import getpass
import os
import sys

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from approvals.defaults import DEFAULT_TOOLS, ensure_policy_defaults
from approvals.models import Tool
from console.models import AgentPrincipal, Membership, RiskTier, Role, Tenant
from runs.defaults import ensure_release_gates

PASSWORD_ENV = "COUNTERSIGN_ADMIN_PASSWORD"


class Command(BaseCommand):
    help = ("Set up a deployment: migrate, install the default policy (tiers, tools, escalation rules, "
            "release gates), create a tenant, its first admin and optionally an agent. Idempotent.")

    def add_arguments(self, parser):
        parser.add_argument("--tenant", default="default", help="Tenant slug (created if missing).")
        parser.add_argument("--tenant-name", default="", help="Tenant display name (default: the slug).")
        parser.add_argument("--admin", default="", help="Username of the first admin (created if missing).")
        parser.add_argument("--admin-email", default="")
        parser.add_argument("--agent", default="", help="Name of an agent principal to create (its token is "
                                                         "printed once, when it is created).")
        parser.add_argument("--no-input", "--noinput", action="store_false", dest="interactive",
                            help=f"Never prompt; the admin's password comes from ${PASSWORD_ENV}.")
        parser.add_argument("--skip-migrate", action="store_true")

    def handle(self, *args, tenant: str, tenant_name: str, admin: str, admin_email: str, agent: str,
               interactive: bool, skip_migrate: bool, **options):
        if not skip_migrate:
            call_command("migrate", interactive=False, verbosity=max(0, options["verbosity"] - 1))
        password = self._admin_password(admin, interactive) if admin and not self._user_exists(admin) else None
        with transaction.atomic():
            ensure_policy_defaults()
            ensure_release_gates()
            tenant_row, created = Tenant.objects.get_or_create(slug=tenant, defaults={"name": tenant_name or tenant})
            self._say(f"tenant {tenant_row.slug}", created)
            if admin:
                self._ensure_admin(admin, admin_email, password, tenant_row)
            token = self._ensure_agent(agent, tenant_row) if agent else None
        self.stdout.write(self.style.SUCCESS(
            f"Policy in place: {Tool.objects.count()} tools, default tiers, escalation rules and release gates."))
        if token:
            self.stdout.write(f"Agent token (shown once; store it now): {token}")

    def _say(self, what: str, created: bool) -> None:
        self.stdout.write(f"{'created' if created else 'exists:'} {what}")

    @staticmethod
    def _user_exists(username: str) -> bool:
        return get_user_model().objects.filter(username=username).exists()

    def _admin_password(self, username: str, interactive: bool) -> str:
        password = os.environ.get(PASSWORD_ENV, "")
        if not password and interactive and sys.stdin.isatty():
            password = getpass.getpass(f"Password for {username}: ")
            if password != getpass.getpass("Again: "):
                raise CommandError("The passwords differ.")
        if not password:
            raise CommandError(f"The admin {username!r} does not exist yet: set ${PASSWORD_ENV} "
                               "(or run interactively) to give them a password.")
        try:
            validate_password(password, get_user_model()(username=username))
        except ValidationError as exc:
            raise CommandError("The admin's password is refused: " + " ".join(exc.messages)) from exc
        return password

    def _ensure_admin(self, username: str, email: str, password: str | None, tenant: Tenant) -> None:
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        if user is None:
            user = User.objects.create_superuser(username=username, email=email, password=password)
        self._say(f"admin {username}", password is not None)
        for role, max_tier in ((Role.ADMIN, None), (Role.REVIEWER, RiskTier.L4), (Role.SUPPORT, None)):
            Membership.objects.get_or_create(user=user, tenant=tenant, role=role, defaults={"max_tier": max_tier})

    def _ensure_agent(self, name: str, tenant: Tenant) -> str | None:
        existing = AgentPrincipal.objects.filter(tenant=tenant, name=name).first()
        if existing is not None:
            self._say(f"agent {tenant.slug}/{name} (its token is not shown again; rotate it in the admin)", False)
            return None
        principal = AgentPrincipal(tenant=tenant, name=name)
        token = principal.set_token()
        principal.save()
        principal.allowed_tools.set(Tool.objects.filter(name__in=[spec["name"] for spec in DEFAULT_TOOLS]))
        self._say(f"agent {tenant.slug}/{name}, allowed the default tools", True)
        return token
