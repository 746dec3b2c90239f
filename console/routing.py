from __future__ import annotations

from django.urls import path

from console.consumers import LiveConsumer

websocket_urlpatterns = [
    path("ws/live/<str:stream>/", LiveConsumer.as_asgi()),
    path("ws/live/<str:stream>/<str:arg>/", LiveConsumer.as_asgi()),
]
