from __future__ import annotations

from django.urls import path

from ledger import control_views

app_name = "stops"

urlpatterns = [
    path("", control_views.stops_page, name="page"),
    path("new/", control_views.stop_create, name="create"),
    path("<str:stop_id>/resume/", control_views.stop_resume, name="resume"),
]
