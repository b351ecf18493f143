"""WebSocket routes, mounted by config.asgi."""

# The console chat consumer registers its route here.
websocket_urlpatterns: list = []
