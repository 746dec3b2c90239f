"""Login throttling (django-axes, shared by every server process through the database): after
AXES_FAILURE_LIMIT wrong passwords for one username from one address, even the right password
is refused until the cool-off has passed; other people and other addresses are not locked."""

from __future__ import annotations

import pytest
from django.test import Client

from console.models import Role
from tests.conftest import make_user

pytestmark = pytest.mark.django_db


def log_in(client: Client, username: str, password: str, ip: str = "10.0.0.1"):
    return client.post("/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR=ip)


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def test_thirty_wrong_passwords_then_the_right_one_does_not_log_in(tenant):
    make_user("reviewer", tenant, Role.REVIEWER, max_tier=3)
    client = Client()
    for _ in range(30):
        log_in(client, "reviewer", "wrong")
    response = log_in(client, "reviewer", "pw")
    assert response.status_code == 429
    assert not logged_in(client)
    assert "Too many failed logins" in response.content.decode()


def test_a_few_mistakes_do_not_lock_and_a_success_resets_them(tenant, settings):
    make_user("reviewer", tenant, Role.REVIEWER, max_tier=3)
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert log_in(client, "reviewer", "wrong").status_code == 200
    assert log_in(client, "reviewer", "pw").status_code == 302
    assert logged_in(client)


def test_a_locked_username_does_not_lock_other_people_or_other_addresses(tenant, settings):
    make_user("reviewer", tenant, Role.REVIEWER, max_tier=3)
    make_user("support", tenant, Role.SUPPORT)
    for _ in range(settings.AXES_FAILURE_LIMIT):
        log_in(Client(), "reviewer", "wrong")
    other_person = Client()
    assert log_in(other_person, "support", "pw").status_code == 302
    other_address = Client()
    assert log_in(other_address, "reviewer", "pw", ip="10.0.0.2").status_code == 302
