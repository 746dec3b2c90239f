"""The UI shell in a real browser: login, navigation by role, the dashboard."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from console.models import Role
from tests.conftest import make_user

pytestmark = pytest.mark.django_db(transaction=True)


def log_in(page, base_url: str, username: str, password: str = "pw") -> None:
    page.goto(base_url + "/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()


def test_the_login_page_refuses_a_wrong_password(live_server, page, screenshot, tenant):
    make_user("reviewer", tenant, Role.REVIEWER, max_tier=3)
    log_in(page, live_server.url, "reviewer", "wrong")
    expect(page.get_by_role("alert")).to_contain_text("didn't match")
    screenshot(page, "login-error")


def test_a_reviewer_sees_approvals_but_not_admin(live_server, page, screenshot, tenant):
    make_user("reviewer", tenant, Role.REVIEWER, max_tier=3)
    log_in(page, live_server.url, "reviewer")
    expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()
    nav = page.get_by_role("navigation", name="Main")
    expect(nav.get_by_role("link", name="Approvals")).to_be_visible()
    expect(nav.get_by_role("link", name="Admin")).to_have_count(0)
    screenshot(page, "dashboard-reviewer")


def test_support_staff_do_not_see_approvals(live_server, page, tenant):
    make_user("support", tenant, Role.SUPPORT)
    log_in(page, live_server.url, "support")
    nav = page.get_by_role("navigation", name="Main")
    expect(nav.get_by_role("link", name="Dashboard")).to_be_visible()
    expect(nav.get_by_role("link", name="Approvals")).to_have_count(0)


def test_an_anonymous_visitor_is_sent_to_the_login_page(live_server, page, screenshot):
    page.goto(live_server.url + "/dashboard/")
    expect(page).to_have_url(live_server.url + "/accounts/login/?next=/dashboard/")
    screenshot(page, "login")


def test_the_shell_fits_a_phone_without_sideways_scrolling(live_server, new_page, screenshot, tenant):
    make_user("phone", tenant, Role.REVIEWER, Role.SUPPORT, max_tier=4, is_staff=True)
    page = new_page(viewport=(390, 800))
    log_in(page, live_server.url, "phone")
    for path in ("/dashboard/", "/runs/"):
        page.goto(live_server.url + path)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390, path
    screenshot(page, "runs-phone", full_page=False)
