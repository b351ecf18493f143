"""OpenAI's ``service_tier`` -> the engine's scheduling class, within a tier.

A request may ask for ``auto``, ``default``, ``flex`` or ``priority``; the
engine schedules by ``wire.requests.ServiceClass`` inside the tenant's tier
(tiers keep their weighted share; the class orders the tier's own queue).
What the tier allows decides what is served: ``auto`` (or no
``service_tier``) is the tier's ``auto_service_tier``, and ``priority`` on
a tier without ``priority_service_tier`` is served at ``default``. As with
OpenAI, the response names the tier actually used, never the one asked for.
The batch class is the Batch API's and is not asked for here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from wire.requests import ServiceClass

if TYPE_CHECKING:
    from tenants.models import Tier

# The values the API accepts (OpenAI's).
ServiceTier = Literal["auto", "default", "flex", "priority"]


def service_class_for(*, requested: str | None, tier: Tier) -> ServiceClass:
    """The class a request asking for ``requested`` is served at on ``tier``."""
    wanted = tier.auto_service_tier if requested in (None, "auto") else requested
    if wanted == ServiceClass.FLEX:
        return ServiceClass.FLEX
    if wanted == ServiceClass.PRIORITY and tier.priority_service_tier:
        return ServiceClass.PRIORITY
    return ServiceClass.DEFAULT
