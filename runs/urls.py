from django.urls import path

from runs import views

app_name = "runs"
urlpatterns = [
    path("", views.run_list, name="list"),
    path("<str:task_id>/", views.run_detail, name="detail"),
    path("<str:task_id>/trace/", views.run_trace, name="trace"),
]
