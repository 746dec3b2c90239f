"""Settings read typed environment variables; a bad value stops start-up and names the variable."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from environs import Env, EnvValidationError

ROOT = Path(__file__).resolve().parents[2]
GOOD_SECRET = "k" * 50
GOOD_AUDIT_KEY = "4be1d0c79a3f52e86d1c0b7a9e2f4d35"


def manage_check(tmp_path: Path, **variables: str) -> subprocess.CompletedProcess:
    """`manage.py check` in a fresh process with exactly these Countersign variables set."""
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "SYSTEMROOT")}
    environment = {
        **base,
        "DJANGO_SETTINGS_MODULE": "console.settings",
        "COUNTERSIGN_VAR_DIR": str(tmp_path),
        "PYTHONDONTWRITEBYTECODE": "1",
        **variables,
    }
    return subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=environment,
        capture_output=True, text=True, timeout=60,
    )


def test_the_defaults_start_in_embedded_mode(tmp_path):
    result = manage_check(tmp_path)
    assert result.returncode == 0, result.stderr


def test_a_complete_production_configuration_starts(tmp_path):
    result = manage_check(
        tmp_path, COUNTERSIGN_ENV="production", SECRET_KEY=GOOD_SECRET, DEBUG="false",
        ALLOWED_HOSTS="countersign.example.com", AUDIT_SIGNING_KEY=GOOD_AUDIT_KEY,
    )
    assert result.returncode == 0, result.stderr


# A value that does not parse or validate is environs' EnvValidationError naming the variable;
# a combination that production refuses is Django's ImproperlyConfigured.
INVALID = "EnvValidationError: Environment variable"
REFUSED = "ImproperlyConfigured"


@pytest.mark.parametrize(
    ("variables", "error", "named"),
    [
        ({"DEBUG": "maybe"}, INVALID, "DEBUG"),
        ({"PORT": "notanumber"}, INVALID, "PORT"),
        ({"PORT": "0"}, INVALID, "PORT"),
        ({"PORT": "70000"}, INVALID, "PORT"),
        ({"DATABASE_URL": "mysql://x"}, INVALID, "DATABASE_URL"),
        ({"DATABASE_URL": "localhost:5432"}, INVALID, "DATABASE_URL"),
        ({"CELERY_BROKER_URL": "kafka://x"}, INVALID, "CELERY_BROKER_URL"),
        ({"CHANNEL_LAYER_URL": "redis:/x"}, INVALID, "CHANNEL_LAYER_URL"),
        ({"LIVE_POLL_SECONDS": "0"}, INVALID, "LIVE_POLL_SECONDS"),
        ({"SWEEP_SECONDS": "nan"}, INVALID, "SWEEP_SECONDS"),
        ({"TENANT_MAX_IN_FLIGHT": "8.5"}, INVALID, "TENANT_MAX_IN_FLIGHT"),
        ({"LOG_LEVEL": "LOUD"}, INVALID, "LOG_LEVEL"),
        ({"COUNTERSIGN_ENV": "staging"}, INVALID, "COUNTERSIGN_ENV"),
        ({"COUNTERSIGN_ENV": "production"}, REFUSED, "SECRET_KEY"),
        ({"COUNTERSIGN_ENV": "production", "SECRET_KEY": "too-short"}, REFUSED, "SECRET_KEY"),
        ({"COUNTERSIGN_ENV": "production", "SECRET_KEY": "insecure-" + "x" * 40}, REFUSED, "SECRET_KEY"),
        ({"COUNTERSIGN_ENV": "production", "SECRET_KEY": GOOD_SECRET, "DEBUG": "true"}, REFUSED, "DEBUG"),
        ({"COUNTERSIGN_ENV": "production", "SECRET_KEY": GOOD_SECRET}, REFUSED, "AUDIT_SIGNING_KEY"),
        ({"COUNTERSIGN_ENV": "production", "SECRET_KEY": GOOD_SECRET, "AUDIT_SIGNING_KEY": "short"}, REFUSED,
         "AUDIT_SIGNING_KEY"),
    ],
    ids=lambda value: value if isinstance(value, str) else "-".join(f"{k}={v[:12]}" for k, v in value.items()),
)
def test_a_bad_variable_fails_start_up_with_a_message_naming_it(tmp_path, variables, error, named):
    result = manage_check(tmp_path, **variables)

    assert result.returncode != 0
    assert error in result.stderr
    assert named in result.stderr
    if error == INVALID:
        assert f'Environment variable "{named}" invalid' in result.stderr


def test_the_port_leaves_room_for_the_three_sandbox_ports_above_it(tmp_path):
    # The mail sandbox's SMTP port defaults to PORT + 3, which must still be a port.
    result = manage_check(tmp_path, PORT="65533")

    assert result.returncode != 0
    assert 'Environment variable "PORT" invalid' in result.stderr


# --- what settings.py adds to environs --------------------------------------------------------

NAME = "COUNTERSIGN_TEST_VARIABLE"


@pytest.fixture
def read(monkeypatch):
    """Set the test variable (None: unset) and read it with a fresh reader and settings' parsers."""
    from console import settings

    def read_(raw: str | None, method: str, *args, **kwargs):
        if raw is None:
            monkeypatch.delenv(NAME, raising=False)
        else:
            monkeypatch.setenv(NAME, raw)
        reader = Env(expand_vars=False)
        reader.add_parser("csv", settings._csv)
        return getattr(reader, method)(NAME, *args, **kwargs)

    return read_


def test_csv_splits_on_commas_strips_and_drops_blanks(read):
    assert read(" a.example.com , b.example.com,, ", "csv", []) == ["a.example.com", "b.example.com"]
    assert read("", "csv", ["default"]) == []
    assert read(None, "csv", ["default"]) == ["default"]


@pytest.mark.parametrize("raw", ["postgres://u@h/db", "postgresql://h/db", "sqlite:///tmp/x.sqlite3"])
def test_schemes_accepts_its_schemes(read, raw):
    from console.settings import _schemes

    assert read(raw, "str", "", validate=_schemes("sqlite", "postgres", "postgresql")) == raw


@pytest.mark.parametrize("raw", ["mysql://x", "localhost:5432", "", "postgres:/x"])
def test_schemes_rejects_other_schemes_naming_the_variable(read, raw):
    from console.settings import _schemes

    with pytest.raises(EnvValidationError, match=f'"{NAME}" invalid.*scheme among sqlite, postgres'):
        read(raw, "str", "", validate=_schemes("sqlite", "postgres", "postgresql"))


def test_env_example_lists_every_variable_the_settings_read():
    source = (ROOT / "console" / "settings.py").read_text()
    read = set(re.findall(r'env\.\w+\(\s*"([A-Z_]+)"', source))
    listed = set(re.findall(r"^#? ?([A-Z_]+)=", (ROOT / ".env.example").read_text(), re.MULTILINE))
    assert len(read) > 50
    assert read - listed == set()


def _setting_in(tmp_path: Path, name: str, **variables: str) -> str:
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "SYSTEMROOT")}
    result = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); from django.conf import settings; print(settings.{name})"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**base, "DJANGO_SETTINGS_MODULE": "console.settings", "COUNTERSIGN_VAR_DIR": str(tmp_path), **variables})
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_webhooks_to_private_addresses_are_refused_in_production_and_allowed_embedded(tmp_path):
    production = {"COUNTERSIGN_ENV": "production", "SECRET_KEY": GOOD_SECRET, "AUDIT_SIGNING_KEY": GOOD_AUDIT_KEY}

    assert _setting_in(tmp_path, "WEBHOOK_ALLOW_PRIVATE_ADDRESSES", **production) == "False"
    assert _setting_in(tmp_path, "WEBHOOK_ALLOW_PRIVATE_ADDRESSES") == "True"
    assert _setting_in(tmp_path, "WEBHOOK_ALLOW_PRIVATE_ADDRESSES", **production,
                       WEBHOOK_ALLOW_PRIVATE_ADDRESSES="true") == "True"


def test_a_worker_runs_eight_dispatches_at_once_by_default(tmp_path):
    # A dispatch holds its thread through two commits, two doorbell rings and the provider
    # call: with four threads, 16 agents' calls waited in the broker for a free one
    # (docs/benchmarks.md, "what an agent waits for").
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "SYSTEMROOT")}
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c",
         "from django.conf import settings; print(settings.CELERY_WORKER_POOL, settings.CELERY_WORKER_CONCURRENCY)"],
        cwd=ROOT, env={**base, "DJANGO_SETTINGS_MODULE": "console.settings", "COUNTERSIGN_VAR_DIR": str(tmp_path)},
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-2:] == ["threads", "8"]
