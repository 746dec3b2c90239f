"""console.middleware: the web server's handler runs the middleware's hooks on the event loop,
and sends them to the request's thread only when they may touch the database (the session,
messages, a form's CSRF check) — which work there as with Django's own."""

from __future__ import annotations

import asyncio
import re

import pytest
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.http import HttpResponse
from django.test import override_settings
from django.urls import path

from console.middleware import asgi_handler
from tests.console.asgi_driver import Browser, call, counting_hops


def hops_for(path: str) -> tuple[int, int]:
    app = asgi_handler()

    async def run():
        answer, hops = await counting_hops(lambda: call(app, path))
        return answer.status, hops

    return asyncio.run(run())


@pytest.mark.django_db(transaction=True)
def test_a_sync_view_hops_to_a_thread_only_for_itself_and_djangos_own_signals():
    status, hops = hops_for("/healthz")
    assert status == 200
    # request_started's receivers, the view, response.close(): Django's MiddlewareMixin would
    # add fifteen more, one or two for each of the eight middleware.
    assert hops <= 3


@pytest.mark.django_db(transaction=True)
def test_an_async_view_hops_only_for_djangos_own_signals_and_log():
    # /api/v1/calls/ is the async long-poll: a missing token is answered before any query.
    status, hops = hops_for("/api/v1/calls/nope")
    assert status == 401
    # request_started's receivers, Django's log line for a 4xx, response.close().
    assert hops <= 3


def test_djangos_names_stay_in_the_setting_for_its_deploy_checks(settings):
    assert "django.middleware.security.SecurityMiddleware" in settings.MIDDLEWARE
    asgi_handler()
    assert "console.middleware.SecurityMiddleware" not in settings.MIDDLEWARE


@pytest.mark.django_db(transaction=True)
def test_a_login_saves_the_session_and_the_next_page_reads_it():
    get_user_model().objects.create_user(username="ada", password="pw")
    browser = Browser(asgi_handler())

    async def login_then_dashboard():
        page = await browser.request("/accounts/login/")
        token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page.body).group(1).decode()
        answer = await browser.request("/accounts/login/", method="POST", form={
            "username": "ada", "password": "pw", "csrfmiddlewaretoken": token})
        assert answer.status == 302, answer.body[:500]
        return await browser.request("/dashboard/")

    assert asyncio.run(login_then_dashboard()).status == 200  # not a redirect to the login page


@pytest.mark.django_db(transaction=True)
def test_a_form_post_without_its_csrf_token_is_refused():
    browser = Browser(asgi_handler())
    answer = asyncio.run(browser.request("/accounts/login/", method="POST", form={"username": "a", "password": "b"}))
    assert answer.status == 403


def _add_message(request):
    messages.info(request, "kept in the session")
    return HttpResponse("added")


def _show_messages(request):
    return HttpResponse(" | ".join(str(message) for message in messages.get_messages(request)))


urlpatterns = [path("add", _add_message), path("show", _show_messages)]


@pytest.mark.django_db(transaction=True)
@override_settings(ROOT_URLCONF=__name__, MESSAGE_STORAGE="django.contrib.messages.storage.session.SessionStorage")
def test_a_message_kept_in_the_session_reaches_the_next_page():
    browser = Browser(asgi_handler())

    async def add_twice_then_show():
        await browser.request("/add")  # makes the session
        await browser.request("/add")  # stores into the session, which nothing loaded before
        return await browser.request("/show")

    assert asyncio.run(add_twice_then_show()).body == b"kept in the session | kept in the session"
