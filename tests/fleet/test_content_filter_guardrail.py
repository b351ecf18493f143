"""A canary whose replies safety cuts trips the content_filter_rate guardrail.

Stable (v1) and canary (v2) are scripted workers on the in-process bus;
requests go through the API with the openai SDK, so every usage record is
the relay's, and a cut reply is recorded ``content_filter`` as in
production. The stub policy's one check flags any reply that contains
"canary", which only v2 writes.
"""

import pytest
from asgiref.sync import sync_to_async

from fleet import services
from fleet.models import Deployment, Rollout
from safety import selectors as safety_selectors
from safety.checks import Finding
from safety.policy import Action, Policy
from tests.plugins.asgi_client import sdk_client
from tests.plugins.request_path import DEMO

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_db_threads", "demo_model"),
]


class CanaryMarker:
    """A stand-in for a guard model: flags any text that mentions the canary."""

    name = "stub_guard"

    def run(self, texts: list[str]) -> list[list[Finding]]:
        return [[Finding(self.name, "canary")] if "canary" in t.lower() else [] for t in texts]


STUB = Policy(
    classifier=Action.OFF,
    pii=Action.OFF,
    deny=Action.OFF,
    extra=((CanaryMarker(), Action.BLOCK),),
)


async def test_a_canary_whose_replies_are_filtered_is_rolled_back(
    fake_worker,
    api_key_factory,
    monkeypatch,
):
    monkeypatch.setattr(safety_selectors, "policy_for_tenant", lambda *, tenant: STUB)
    fake_worker(texts=["All", " good", " here."], worker_id="stable-worker", version="v1")
    fake_worker(texts=["The", " canary", " speaks."], worker_id="canary-worker", version="v2")

    def setup():
        services.deployment_register(model_name=DEMO, version="v1")
        services.deployment_register(model_name=DEMO, version="v2")
        rollout = services.rollout_start(
            model_name=DEMO,
            canary_version="v2",
            steps=[50, 100],
            guardrails={"min_requests": 4, "min_breach_requests": 4, "ttft_p95_ratio": 1e6},
        )
        return rollout.pk, api_key_factory(tier="pro")[1]

    rollout_id, raw = await sync_to_async(setup)()
    client = sdk_client(raw)
    finish = {}
    for i in range(24):
        completion = await client.chat.completions.create(
            model=DEMO,
            messages=[{"role": "user", "content": "Report."}],
            extra_headers={"X-Conversation-Id": f"conversation-{i}"},
        )
        finish[completion.choices[0].message.content] = completion.choices[0].finish_reason
    # The canary's replies are cut once "canary" is a complete word (an extra
    # check judges complete words only, so the word itself went out);
    # stable's replies are whole.
    assert finish == {"All good here.": "stop", "The canary": "content_filter"}

    rollout = await sync_to_async(services.rollout_advance)(rollout_id=rollout_id)
    assert rollout.state == Rollout.State.ROLLED_BACK
    assert "content_filter_rate" in rollout.reason
    (step,) = rollout.results
    assert step["canary"]["content_filter_rate"] == 1.0
    assert step["stable"]["content_filter_rate"] == 0.0
    weights = await sync_to_async(dict)(
        Deployment.objects.filter(model_name=DEMO).values_list("version", "traffic_weight")
    )
    assert weights == {"v1": 100, "v2": 0}
