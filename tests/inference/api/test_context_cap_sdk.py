"""The per-tier context cap through the official SDK: a typed 400 before any GPU work."""

import openai
import pytest

from tests.plugins.asgi_client import sdk_client
from tests.plugins.request_path import DEMO

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def test_prompt_plus_max_tokens_over_the_tier_cap_is_context_length_exceeded(
    api_key_factory, demo_model, memory_bus
):
    """The tier's context cap is enforced before dispatch: no worker is
    running, so a request that got as far as dispatch would be a 503."""
    from asgiref.sync import sync_to_async

    from tenants.models import Tier

    def make():
        tier = Tier.objects.get(name="pro")
        return api_key_factory(tier=tier.name), tier.max_context_tokens

    (_, raw), cap = await sync_to_async(make)()
    long_message = "word " * (cap + 100)
    with pytest.raises(openai.BadRequestError) as error:
        await sdk_client(raw).chat.completions.create(
            model=DEMO, messages=[{"role": "user", "content": long_message}], max_tokens=16
        )
    assert error.value.code == "context_length_exceeded"
    assert error.value.param == "messages"
    assert error.value.status_code == 400
