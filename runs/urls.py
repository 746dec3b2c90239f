from django.urls import path

from ledger import control_views
from runs import views

app_name = "runs"
urlpatterns = [
    path("", views.run_list, name="list"),
    path("reviews/", views.review_list, name="reviews"),
    path("<str:task_id>/", views.run_detail, name="detail"),
    path("<str:task_id>/trace/", views.run_trace, name="trace"),
    path("<str:task_id>/review/<str:decision>/", views.run_review, name="review"),
    path("<str:task_id>/control/<str:action>/", control_views.task_control, name="control"),
]
