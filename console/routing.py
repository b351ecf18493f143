"""WebSocket routes, mounted by config.asgi."""

from django.urls import path

from console.batch_consumer import BatchProgressConsumer
from console.consumers import ChatConsumer

websocket_urlpatterns: list = [
    path("ws/chat/", ChatConsumer.as_asgi()),
    path("ws/batches/", BatchProgressConsumer.as_asgi()),
]
