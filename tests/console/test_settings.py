"""Settings read typed environment variables; a bad value stops start-up and names the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from console.lib import env

ROOT = Path(__file__).resolve().parents[2]
GOOD_SECRET = "k" * 50


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
        ALLOWED_HOSTS="countersign.example.com",
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("variables", "named"),
    [
        ({"DEBUG": "maybe"}, "DEBUG"),
        ({"PORT": "notanumber"}, "PORT"),
        ({"PORT": "0"}, "PORT"),
        ({"PORT": "70000"}, "PORT"),
        ({"DATABASE_URL": "mysql://x"}, "DATABASE_URL"),
        ({"CELERY_BROKER_URL": "kafka://x"}, "CELERY_BROKER_URL"),
        ({"LIVE_POLL_SECONDS": "0"}, "LIVE_POLL_SECONDS"),
        ({"LOG_LEVEL": "LOUD"}, "LOG_LEVEL"),
        ({"COUNTERSIGN_ENV": "staging"}, "COUNTERSIGN_ENV"),
        ({"COUNTERSIGN_ENV": "production"}, "SECRET_KEY"),
        ({"COUNTERSIGN_ENV": "production", "SECRET_KEY": "too-short"}, "SECRET_KEY"),
        ({"COUNTERSIGN_ENV": "production", "SECRET_KEY": "insecure-" + "x" * 40}, "SECRET_KEY"),
        ({"COUNTERSIGN_ENV": "production", "SECRET_KEY": GOOD_SECRET, "DEBUG": "true"}, "DEBUG"),
    ],
    ids=lambda value: value if isinstance(value, str) else "-".join(f"{k}={v[:12]}" for k, v in value.items()),
)
def test_a_bad_variable_fails_start_up_with_a_message_naming_it(tmp_path, variables, named):
    result = manage_check(tmp_path, **variables)

    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert named in result.stderr


def test_the_port_leaves_room_for_the_three_sandbox_ports_above_it(tmp_path):
    # The mail sandbox's SMTP port defaults to PORT + 3, which must still be a port.
    result = manage_check(tmp_path, PORT="65533")

    assert result.returncode != 0
    assert "PORT" in result.stderr


# --- console.lib.env --------------------------------------------------------------------------

NAME = "COUNTERSIGN_TEST_VARIABLE"


@pytest.fixture
def var(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)

    def set_(value: str) -> None:
        monkeypatch.setenv(NAME, value)

    return set_


def test_an_unset_variable_gives_the_default(var):
    assert env.env_str(NAME, "d") == "d"
    assert env.env_bool(NAME, True) is True
    assert env.env_int(NAME, 7) == 7
    assert env.env_float(NAME, 0.5) == 0.5
    assert env.env_list(NAME, ["a"]) == ["a"]
    assert env.env_choice(NAME, "x", ("x", "y")) == "x"
    assert env.env_url(NAME, "memory://", schemes=("memory",)) == "memory://"


def test_env_str_strips_surrounding_whitespace(var):
    var("  value \n")
    assert env.env_str(NAME) == "value"


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", "yes", "on", " On "])
def test_env_bool_reads_true(var, raw):
    var(raw)
    assert env.env_bool(NAME, False) is True


@pytest.mark.parametrize("raw", ["0", "false", "False", "no", "off", ""])
def test_env_bool_reads_false(var, raw):
    var(raw)
    assert env.env_bool(NAME, True) is False


@pytest.mark.parametrize("raw", ["maybe", "2", "y", "enabled"])
def test_env_bool_rejects_anything_else_naming_the_variable(var, raw):
    var(raw)
    with pytest.raises(ImproperlyConfigured, match=NAME):
        env.env_bool(NAME, False)


def test_env_int_reads_an_integer_within_its_bounds(var):
    var(" 8080 ")
    assert env.env_int(NAME, 1, minimum=1, maximum=65535) == 8080


@pytest.mark.parametrize("raw", ["notanumber", "8.5", "", "0x10"])
def test_env_int_rejects_what_is_not_an_integer(var, raw):
    var(raw)
    with pytest.raises(ImproperlyConfigured, match=NAME):
        env.env_int(NAME, 1)


@pytest.mark.parametrize(("raw", "bound"), [("0", ">= 1"), ("65536", "<= 65535")])
def test_env_int_rejects_a_value_out_of_bounds(var, raw, bound):
    var(raw)
    with pytest.raises(ImproperlyConfigured, match=bound):
        env.env_int(NAME, 1, minimum=1, maximum=65535)


def test_env_float_reads_a_number_above_its_minimum(var):
    var("0.25")
    assert env.env_float(NAME, 1.0, minimum=0.01) == 0.25
    var("0.001")
    with pytest.raises(ImproperlyConfigured, match=NAME):
        env.env_float(NAME, 1.0, minimum=0.01)
    var("fast")
    with pytest.raises(ImproperlyConfigured, match=NAME):
        env.env_float(NAME, 1.0)


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "Infinity"])
def test_env_float_rejects_values_that_are_not_finite(var, raw):
    var(raw)
    with pytest.raises(ImproperlyConfigured, match=NAME):
        env.env_float(NAME, 1.0, minimum=0.01)


def test_env_list_splits_on_commas_and_drops_blanks(var):
    var(" a.example.com , b.example.com,, ")
    assert env.env_list(NAME, []) == ["a.example.com", "b.example.com"]
    var("")
    assert env.env_list(NAME, ["default"]) == []


def test_env_choice_accepts_only_its_choices(var):
    var("production")
    assert env.env_choice(NAME, "embedded", ("embedded", "production")) == "production"
    var("Production")
    with pytest.raises(ImproperlyConfigured, match=f"{NAME}.*one of embedded, production"):
        env.env_choice(NAME, "embedded", ("embedded", "production"))


@pytest.mark.parametrize("raw", ["postgres://u@h/db", "postgresql://h/db", "sqlite:///tmp/x.sqlite3"])
def test_env_url_accepts_its_schemes(var, raw):
    var(raw)
    assert env.env_url(NAME, "", schemes=("sqlite", "postgres", "postgresql")) == raw


@pytest.mark.parametrize("raw", ["mysql://x", "localhost:5432", "", "postgres:/x"])
def test_env_url_rejects_other_schemes(var, raw):
    var(raw)
    with pytest.raises(ImproperlyConfigured, match=NAME):
        env.env_url(NAME, "", schemes=("sqlite", "postgres", "postgresql"))


def test_the_error_shows_the_bad_value_and_what_was_expected(var):
    var("notanumber")
    with pytest.raises(ImproperlyConfigured) as excinfo:
        env.env_int(NAME, 1)
    assert str(excinfo.value).startswith(f"Environment variable {NAME}='notanumber' is invalid: expected an integer")
