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


def _header(answer, name: bytes) -> str | None:
    return next((value.decode() for key, value in answer.headers if key.lower() == name.lower()), None)


def _with_nonce(request):
    return HttpResponse(f'<script nonce="{request.csp_nonce}"></script>')


def _plain(request):
    return HttpResponse("no nonce")


urlpatterns += [path("nonce", _with_nonce), path("plain", _plain), path("api/v1/plain", _plain)]


def answers(*paths: str):
    app = asgi_handler()

    async def run():
        return [await call(app, path) for path in paths]

    return asyncio.run(run())


@pytest.mark.django_db(transaction=True)
@override_settings(ROOT_URLCONF=__name__)
def test_the_policy_of_an_answer_without_a_nonce_is_built_once_and_is_django_csps(client, monkeypatch):
    """django-csp builds the header for every answer (two deep copies of the configuration);
    one that used no nonce and changes nothing per view gets the settings' policy, built once."""
    from csp import middleware as csp_middleware

    built = []
    real_build = csp_middleware.build_policy
    monkeypatch.setattr(csp_middleware, "build_policy", lambda **kw: built.append(kw) or real_build(**kw))
    expected = client.get("/plain")["Content-Security-Policy"]  # Django's own middleware (sync)
    built.clear()

    first, second, api = answers("/plain", "/plain", "/api/v1/plain")

    assert {_header(first, b"content-security-policy"), _header(second, b"content-security-policy"),
            _header(api, b"content-security-policy")} == {expected}
    assert "nonce" not in expected and "'self'" in expected
    assert built == []


@pytest.mark.django_db(transaction=True)
@override_settings(ROOT_URLCONF=__name__)
def test_a_page_that_uses_its_nonce_still_gets_a_fresh_one_in_its_policy():
    first, second = answers("/nonce", "/nonce")

    nonces = [re.search(r"nonce-([^']+)'", _header(answer, b"content-security-policy")).group(1)
              for answer in (first, second)]
    assert nonces[0] != nonces[1]
    assert [answer.body.decode() for answer in (first, second)] == [
        f'<script nonce="{nonce}"></script>' for nonce in nonces]


@pytest.mark.django_db(transaction=True)
def test_a_changed_policy_setting_is_the_one_sent(settings):
    # Both through the fixture, which undoes its changes in reverse order: mixed with the
    # decorator, its undo would put the decorator's URLconf back after the decorator's own.
    settings.ROOT_URLCONF = __name__
    (before,) = answers("/plain")
    settings.CONTENT_SECURITY_POLICY = {"DIRECTIVES": {"default-src": ["'none'"]}}
    (after,) = answers("/plain")

    assert _header(after, b"content-security-policy") == "default-src 'none'"
    assert _header(before, b"content-security-policy") != "default-src 'none'"


@pytest.mark.django_db(transaction=True)
@override_settings(ROOT_URLCONF=__name__)
def test_an_api_request_makes_no_message_storage_and_a_page_still_does(monkeypatch):
    """Nothing under the API's paths adds or shows a message: no storage is made for it (the
    cookie storage's signer and the fallback's two storages, for every agent's call)."""
    from django.contrib.messages import middleware as messages_middleware

    made = []
    real_storage = messages_middleware.default_storage
    monkeypatch.setattr(messages_middleware, "default_storage", lambda request: made.append(request.path)
                        or real_storage(request))

    answers("/api/v1/plain", "/plain")

    assert made == ["/plain"]
