"""Playwright fixtures for the browser tests: headless Debian Chromium, no downloads.

Knows nothing about Django: the live server fixture lives elsewhere; pass its URL to
``page.goto(live_server.url + "/approvals/")`` or to ``new_page(base_url=...)``.

Fixtures
    chromium_path   session   str: env CHROMIUM_PATH, default /usr/bin/chromium
    browser         session   playwright Browser (headless, flags below)
    new_page        function  factory: new_page(*, viewport=(1280, 800), **context_kwargs) -> Page,
                              each call a fresh context (own cookies: one per user)
    page            function  Page in a new context, 1280x800, default timeout 10 s
    screenshot      function  screenshot(page, name, *, full_page=True) -> Path

Also importable: ``save_screenshot(page, name, *, full_page=True) -> Path``, which writes
``artifacts/screenshots/<name>.png`` (env ARTIFACTS_DIR moves ``artifacts/``).

Every test in this directory is marked ``browser`` and fails on any Content-Security-Policy
violation the browser reports; on failure each open page is saved as
``artifacts/screenshots/failed/<test>-<n>.png``. Requests to hosts other than this machine are
aborted (no CDN, no telemetry): the product must serve its own assets.

Never run ``playwright install``: it downloads a browser, which cannot work here. Install
Debian's ``chromium`` package instead.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, expect, sync_playwright

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
VIEWPORT = {"width": 1280, "height": 800}
DEFAULT_TIMEOUT_MS = 10_000
# `expect` keeps its own timeout (5 s unless told): on a loaded 2-core machine a live update can
# take longer, so assertions wait as long as actions and navigations do.
expect.set_options(timeout=DEFAULT_TIMEOUT_MS)
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]", "testserver"}

REPO_ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def _artifacts_dir() -> Path:
    return Path(os.environ.get("ARTIFACTS_DIR", REPO_ROOT / "artifacts"))


def _safe_name(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    return cleaned or "screenshot"


def _write_png(page: Page, path: Path, *, full_page: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=full_page)
    return path


def save_screenshot(page: Page, name: str, *, full_page: bool = True) -> Path:
    """Write ``artifacts/screenshots/<name>.png`` and return its path."""
    return _write_png(
        page, _artifacts_dir() / "screenshots" / f"{_safe_name(name)}.png", full_page=full_page
    )


def _is_local(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme in ("data", "blob", "about", "file", "chrome", "devtools"):
        return True
    host = (parts.hostname or "").lower()
    return host in LOCAL_HOSTS or host.startswith("127.") or host.endswith(".localhost")


def pytest_configure(config: pytest.Config) -> None:
    # Also registered in pyproject.toml; repeated so this directory works under --strict-markers
    # from any rootdir.
    config.addinivalue_line(
        "markers", "browser: Playwright tests in headless Chromium against a live server"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.browser)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    # Pages are still open here: fixture teardown runs after the call phase is reported.
    pages: list[Page] = getattr(item, "_countersign_pages", [])
    for n, page in enumerate(pages):
        if page.is_closed():
            continue
        path = _artifacts_dir() / "screenshots" / "failed" / f"{_safe_name(item.nodeid)}-{n}.png"
        try:
            _write_png(page, path, full_page=True)
            report.sections.append(("browser screenshot", str(path)))
        except Exception as exc:  # a crashed page must not hide the real failure
            report.sections.append(("browser screenshot", f"could not take one: {exc!r}"))


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
    if not Path(path).exists():
        pytest.fail(
            f"Chromium not found at {path}: `apt-get install -y chromium` (Debian) or set "
            "CHROMIUM_PATH. Do not run `playwright install`.",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="session")
def _playwright() -> Iterator[Playwright]:
    # Playwright's sync API keeps an asyncio loop marked as running in this thread for as long
    # as it is started, so Django's async-safety guard would refuse every ORM call made by the
    # test itself (SynchronousOnlyOperation), and by any test that runs after the first browser
    # test in the same process. The calls are in fact synchronous; lift the guard while
    # Playwright runs and put it back afterwards.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as pw:
            yield pw
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture(scope="session")
def browser(_playwright: Playwright, chromium_path: str) -> Iterator[Browser]:
    browser = _playwright.chromium.launch(
        executable_path=chromium_path,
        headless=True,
        args=CHROMIUM_ARGS,
    )
    try:
        yield browser
    finally:
        browser.close()


def _block_remote(context: BrowserContext) -> None:
    def abort(route: Any) -> None:
        print(f"[browser] blocked non-local request: {route.request.url}")
        route.abort("blockedbyclient")

    context.route(lambda url: not _is_local(url), abort)


@pytest.fixture
def new_page(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Callable[..., Page]]:
    contexts: list[BrowserContext] = []
    pages: list[Page] = []
    request.node._countersign_pages = pages

    def factory(*, viewport: tuple[int, int] | None = None, **context_kwargs: Any) -> Page:
        size = {"width": viewport[0], "height": viewport[1]} if viewport else dict(VIEWPORT)
        context_kwargs.setdefault("locale", "en-US")
        context_kwargs.setdefault("timezone_id", "UTC")
        context = browser.new_context(viewport=size, **context_kwargs)
        context.set_default_timeout(DEFAULT_TIMEOUT_MS)
        context.set_default_navigation_timeout(DEFAULT_TIMEOUT_MS)
        _block_remote(context)
        contexts.append(context)
        page = context.new_page()
        # Every page runs under the Content-Security-Policy; a violation fails the test.
        page.on("console", lambda msg: violations.append(msg.text)
                if "Content Security Policy" in msg.text and "cdn.redoc.ly" not in msg.text else None)
        pages.append(page)
        return page

    violations: list[str] = []
    yield factory
    for context in contexts:
        context.close()
    assert violations == [], f"Content-Security-Policy violations: {violations}"


@pytest.fixture
def page(new_page: Callable[..., Page]) -> Page:
    return new_page()


@pytest.fixture
def screenshot() -> Callable[..., Path]:
    return save_screenshot
