"""Production defaults: the Content-Security-Policy on every page, HSTS and the proxy's TLS,
`check --deploy` clean, DEBUG off unless asked for, the product's own error pages."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import PermissionDenied
from django.test import RequestFactory
from django.views import defaults

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = {"COUNTERSIGN_ENV": "production", "SECRET_KEY": "Zq3-vT8pL1xW9mN4bR7cY2kH6jD5sF0gA8eU3iO1oP7uE4rW2tQ",
              "AUDIT_SIGNING_KEY": "9f2c61e0b4d84a7f8e3b5c1d2a6f7e80", "ALLOWED_HOSTS": "console.example.com"}


def manage(tmp_path: Path, *args: str, **variables: str) -> subprocess.CompletedProcess:
    """`manage.py ARGS` in a fresh process with exactly these Countersign variables set."""
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL")}
    environment = {**base, "DJANGO_SETTINGS_MODULE": "console.settings", "COUNTERSIGN_VAR_DIR": str(tmp_path),
                   "PYTHONDONTWRITEBYTECODE": "1", **variables}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=60)


def settings_of(tmp_path: Path, *names: str, **variables: str) -> dict:
    code = f"import json; from django.conf import settings as s; print(json.dumps({{n: getattr(s, n) for n in {list(names)!r}}}))"
    result = manage(tmp_path, "shell", "-c", code, **variables)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_page_sends_a_nonce_policy_and_its_scripts_carry_that_nonce(client, db):
    response = client.get("/accounts/login/")
    policy = response["Content-Security-Policy"]
    nonce = re.search(r"'nonce-([^']+)'", policy).group(1)
    assert "script-src 'self' 'nonce-" in policy and "'unsafe-inline'" not in policy
    assert "'unsafe-eval'" not in policy and "frame-ancestors 'none'" in policy
    scripts = re.findall(r"<script[^>]*>", response.content.decode())
    assert scripts and all(f'nonce="{nonce}"' in tag for tag in scripts)
    assert client.get("/accounts/login/")["Content-Security-Policy"] != policy  # a new nonce each time


def test_no_template_carries_an_inline_script_a_style_attribute_or_a_handler():
    offenders = []
    for path in (ROOT / "templates").rglob("*.html"):
        text = path.read_text()
        for pattern in (r"<script(?![^>]*\bsrc=)[^>]*>", r"\sstyle=", r"\son[a-z]+=", r"<style"):
            if re.search(pattern, text):
                offenders.append((path.name, pattern))
    assert offenders == []


def test_check_deploy_is_clean_in_production(tmp_path):
    result = manage(tmp_path, "check", "--deploy", "--fail-level", "WARNING", **PRODUCTION)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_production_sends_hsts_and_redirects_to_https_by_default(tmp_path):
    values = settings_of(tmp_path, "SECURE_HSTS_SECONDS", "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_SSL_REDIRECT",
                         "SECURE_PROXY_SSL_HEADER", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", **PRODUCTION)
    assert values == {"SECURE_HSTS_SECONDS": 31536000, "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
                      "SECURE_SSL_REDIRECT": True, "SECURE_PROXY_SSL_HEADER": None,
                      "SESSION_COOKIE_SECURE": True, "CSRF_COOKIE_SECURE": True}


def test_production_over_plain_http_on_purpose_neither_redirects_nor_sends_hsts(tmp_path):
    values = settings_of(tmp_path, "SECURE_HSTS_SECONDS", "SECURE_SSL_REDIRECT", SESSION_COOKIE_SECURE="false",
                         **PRODUCTION)
    assert values == {"SECURE_HSTS_SECONDS": 0, "SECURE_SSL_REDIRECT": False}


def test_a_proxy_that_terminates_tls_is_named_by_its_header(tmp_path):
    values = settings_of(tmp_path, "SECURE_PROXY_SSL_HEADER", "SECURE_HSTS_SECONDS",
                         SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto", SECURE_HSTS_SECONDS="600", **PRODUCTION)
    assert values == {"SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"], "SECURE_HSTS_SECONDS": 600}


def test_embedded_mode_runs_with_debug_off_unless_a_developer_turns_it_on(tmp_path):
    assert settings_of(tmp_path, "DEBUG") == {"DEBUG": False}
    assert settings_of(tmp_path, "DEBUG", DEBUG="1") == {"DEBUG": True}


@pytest.mark.parametrize(("status", "words"), [(404, "Page not found"), (403, "Not allowed"),
                                               (500, "Something went wrong")])
def test_errors_show_the_products_own_page(rf: RequestFactory, db, status, words):
    request = rf.get("/somewhere/")
    if status == 404:
        from django.http import Http404

        response = defaults.page_not_found(request, Http404("x"))
    elif status == 403:
        response = defaults.permission_denied(request, PermissionDenied())
    else:
        response = defaults.server_error(request)
    html = response.content.decode()
    assert response.status_code == status
    assert words in html and "/static/console/app.css" in html and "Countersign" in html


def test_an_unknown_page_answers_the_products_404(client, db):
    response = client.get("/no-such-page/")
    assert response.status_code == 404
    assert "Page not found" in response.content.decode() and "Content-Security-Policy" in response
