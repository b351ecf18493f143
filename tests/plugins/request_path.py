"""The request path's fixtures: the demo model row and the in-process bus.

The bus is the real in-process one (the one embedded mode uses); the worker
on it is ``tests/plugins/fake_worker.py``'s, or the real engine
(``tests/plugins/engine.py``).
"""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from fleet.services import served_model_register
from tests.plugins.asgi_client import sdk_client
from wire.bus import reset_buses

DEMO = "smollm2-135m-instruct"


@pytest.fixture
def demo_model(tiers):
    """The demo model, open to every tier (transactional tests flush it)."""
    return served_model_register(name=DEMO, context_length=8192)


@pytest.fixture
def pro_key(api_key_factory, demo_model) -> str:
    return api_key_factory(tier="pro")[1]


def auth(key: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


async def pro_client(api_key_factory):
    """The official SDK's async client with a new pro-tier key."""
    _, key = await sync_to_async(api_key_factory)(tier="pro")
    return sdk_client(key)


@pytest.fixture
def memory_bus(settings):
    """The in-process bus (embedded mode's), without starting an engine."""
    settings.REDIS_URL = None
    settings.EMBEDDED_ENGINE = False
    reset_buses()
    yield
    reset_buses()


@pytest.fixture
def close_db_threads():
    """Close the connections that sync_to_async threads opened (async tests)."""
    yield
    from asgiref.sync import async_to_sync

    async_to_sync(sync_to_async(connections.close_all))()
