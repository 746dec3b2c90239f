"""`python manage.py setup`: a first deployment's set-up in one idempotent command — the policy
defaults, a tenant, its first admin and an agent — never the demo identities, and usable in
production, where `seed_demo` refuses."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from approvals.models import EscalationRule, PolicyTier, Tool
from console.models import AgentPrincipal, Membership, Role, Tenant
from runs.models import ReleaseGate

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]
STRONG = "a-long-and-unusual-passphrase-7341"


def run_setup(*args: str) -> str:
    out = io.StringIO()
    call_command("setup", "--skip-migrate", "--no-input", *args, stdout=out)
    return out.getvalue()


def test_installs_the_policy_a_tenant_its_admin_and_an_agent(monkeypatch, client):
    monkeypatch.setenv("COUNTERSIGN_ADMIN_PASSWORD", STRONG)

    out = run_setup("--tenant", "acme-prod", "--tenant-name", "Acme", "--admin", "ops",
                    "--admin-email", "ops@acme.test", "--agent", "billing-bot")

    assert set(PolicyTier.objects.values_list("level", flat=True)) == {0, 1, 2, 3, 4}
    assert {"payments.refund", "orders.lookup", "mail.send"} <= set(Tool.objects.values_list("name", flat=True))
    assert EscalationRule.objects.exists() and ReleaseGate.objects.exists()
    tenant = Tenant.objects.get(slug="acme-prod")
    assert tenant.name == "Acme"
    ops = get_user_model().objects.get(username="ops")
    assert ops.is_superuser and ops.check_password(STRONG)
    roles = dict(Membership.objects.filter(user=ops, tenant=tenant).values_list("role", "max_tier"))
    assert roles == {Role.ADMIN: None, Role.REVIEWER: 4, Role.SUPPORT: None}
    token = re.search(r"Agent token \(shown once; store it now\): (\S+)", out).group(1)
    agent = AgentPrincipal.objects.get(tenant=tenant, name="billing-bot")
    assert set(agent.allowed_tools.values_list("name", flat=True)) >= {"payments.refund", "orders.lookup"}
    # The printed token is the agent's: the API accepts it.
    answer = client.get("/api/v1/tasks/does-not-exist",
                        HTTP_AUTHORIZATION=f"Bearer {token}")
    assert answer.status_code == 404  # authenticated (an unknown token answers 401)
    # Never the demo identities.
    assert not get_user_model().objects.filter(username__in=["admin", "reviewer", "senior", "support"]).exists()
    assert not Tenant.objects.filter(slug="acme").exists()
    assert not AgentPrincipal.objects.filter(name="demo-agent").exists()


def test_a_second_run_changes_nothing_and_shows_no_token(monkeypatch):
    monkeypatch.setenv("COUNTERSIGN_ADMIN_PASSWORD", STRONG)
    run_setup("--admin", "ops", "--agent", "bot")
    agent = AgentPrincipal.objects.get(name="bot")
    counts = (Tool.objects.count(), PolicyTier.objects.count(), EscalationRule.objects.count(),
              Membership.objects.count(), ReleaseGate.objects.count())

    monkeypatch.setenv("COUNTERSIGN_ADMIN_PASSWORD", "another-password-entirely-9921")
    out = run_setup("--admin", "ops", "--agent", "bot")

    assert "Agent token" not in out
    assert "exists: agent default/bot" in out and "exists: admin ops" in out
    assert AgentPrincipal.objects.get(name="bot").token_hash == agent.token_hash
    assert get_user_model().objects.get(username="ops").check_password(STRONG)
    assert counts == (Tool.objects.count(), PolicyTier.objects.count(), EscalationRule.objects.count(),
                      Membership.objects.count(), ReleaseGate.objects.count())


def test_a_new_admin_without_a_password_is_refused_before_anything_is_written(monkeypatch):
    monkeypatch.delenv("COUNTERSIGN_ADMIN_PASSWORD", raising=False)

    with pytest.raises(CommandError, match="COUNTERSIGN_ADMIN_PASSWORD"):
        run_setup("--admin", "ops")

    assert not Tool.objects.exists() and not Tenant.objects.exists()


def test_the_admin_password_meets_the_password_validators(monkeypatch, settings):
    settings.AUTH_PASSWORD_VALIDATORS = [
        {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    ]
    monkeypatch.setenv("COUNTERSIGN_ADMIN_PASSWORD", "short")

    with pytest.raises(CommandError, match="password is refused"):
        run_setup("--admin", "ops")

    assert not get_user_model().objects.filter(username="ops").exists()


def test_it_runs_in_production_where_the_demo_seed_refuses(tmp_path):
    env = {**os.environ, "COUNTERSIGN_ENV": "production", "SECRET_KEY": "k" * 20 + "production-like-secret-key-0123", "AUDIT_SIGNING_KEY": "a" * 64,
           "DEBUG": "false", "COUNTERSIGN_VAR_DIR": str(tmp_path),
           "DATABASE_URL": f"sqlite:///{tmp_path / 'prod.sqlite3'}", "CELERY_BROKER_URL": "memory://",
           "COUNTERSIGN_ADMIN_PASSWORD": STRONG}
    env.pop("CHANNEL_LAYER_URL", None)
    command = [sys.executable, "manage.py"]

    seeded = subprocess.run([*command, "seed_demo"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    done = subprocess.run([*command, "setup", "--no-input", "--admin", "ops", "--agent", "bot"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)

    assert seeded.returncode != 0
    assert done.returncode == 0, done.stderr[-3000:]
    assert "created admin ops" in done.stdout
    assert "Agent token (shown once; store it now): cs_" in done.stdout
