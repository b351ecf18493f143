"""While a model's workers load and warm up, requests are told so at once:
503 ``model_warming_up`` with Retry-After, in OpenAI's error shape."""

import json
import threading

import pytest

from billing.models import UsageRecord
from tests.plugins.request_path import DEMO, auth
from tests.wire.bus.buses import uid
from wire.bus import get_worker_bus
from wire.workers import WorkerInfo, WorkerState

pytestmark = pytest.mark.django_db


@pytest.fixture
def warming_worker(memory_bus):
    """A worker of the demo model that registered and heartbeats, still warming
    up, as a gpuworker does while it loads and compiles (for as long as the test)."""
    bus = get_worker_bus()
    info = WorkerInfo(worker_id=uid("w"), model=DEMO, state=WorkerState.WARMING)
    bus.register(info)
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(0.3):
            bus.heartbeat(info)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    yield info
    stop.set()
    thread.join()
    bus.deregister(info.worker_id)


def test_a_request_while_the_model_warms_up_is_told_when_to_retry(client, pro_key, warming_worker):
    """Answered at once (not held until a worker is ready), nothing billed."""
    body = {"model": DEMO, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    response = client.post(
        "/v1/chat/completions", json.dumps(body), content_type="application/json", **auth(pro_key)
    )
    assert response.status_code == 503, response.content
    assert response.get("Retry-After") == "5", response.content
    assert json.loads(response.content) == {
        "error": {
            "message": f"The model '{DEMO}' is warming up. Retry in a few seconds.",
            "type": "server_error",
            "param": None,
            "code": "model_warming_up",
        }
    }
    assert not UsageRecord.objects.filter(model=DEMO).exists()
