from __future__ import annotations

from django.urls import path

from ledger import views

app_name = "operations"

urlpatterns = [
    path("unknown/", views.unknown, name="unknown"),
    path("<str:operation_id>/", views.detail, name="detail"),
    path("<str:operation_id>/query/", views.query_provider, name="query"),
    path("<str:operation_id>/confirm/", views.confirm, name="confirm"),
    path("<str:operation_id>/retry/", views.retry, name="retry"),
    path("<str:operation_id>/fail/", views.fail, name="fail"),
    path("<str:operation_id>/escalate/", views.escalate, name="escalate"),
    path("<str:operation_id>/compensate/", views.compensate, name="compensate"),
    path("<str:operation_id>/compensated/", views.compensated, name="compensated"),
]
