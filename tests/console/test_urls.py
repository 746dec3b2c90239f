"""URL resolution of the agent's hot paths: every agent call resolves its URL first, so the
agent API is tried before the console's pages, and within it the proposal and the long-poll
before the rest."""

from __future__ import annotations

import pytest
from django.urls import resolve
from django.urls.resolvers import URLPattern


@pytest.fixture
def patterns_tried(monkeypatch):
    tried: list[str] = []
    match = URLPattern.resolve

    def counting(self, path):
        tried.append(str(self.pattern))
        return match(self, path)

    monkeypatch.setattr(URLPattern, "resolve", counting)
    return tried


@pytest.mark.parametrize(("path", "name", "tried"), [
    ("/api/v1/tasks/t-1/calls", "api-call-propose", 1),
    ("/api/v1/calls/c-1", "api-call-get", 2),
])
def test_an_agents_hot_path_is_among_the_first_patterns_tried(patterns_tried, path, name, tried):
    assert resolve(path).url_name == name
    assert len(patterns_tried) == tried, patterns_tried


@pytest.mark.parametrize(("path", "name"), [
    ("/api/v1/tasks", "api-task-create"),
    ("/api/v1/tasks/t-1", "api-task-get"),
    ("/api/v1/tasks/t-1/lease", "api-task-lease"),
    ("/api/v1/tasks/t-1/transition", "api-task-transition"),
    ("/api/v1/operations/op-1", "api-operation-get"),
    ("/api/v1/tools", "api-tool-list"),
    ("/api/v1/calls/a/b%2Fc", "api-call-get"),
    ("/api/v1/stops", "api-stops"),
    ("/api/v1/stops/s-1/resume", "api-stop-resume"),
    ("/api/schema/", "api-schema"),
    ("/api/docs/", "api-docs"),
    ("/", "home"),
    ("/healthz", "healthz"),
    ("/v1/traces", "otlp-traces"),
])
def test_every_other_path_still_resolves_to_its_view(path, name):
    assert resolve(path).url_name == name
