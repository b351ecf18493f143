"""The one NinjaAPI; each app contributes a Router and maps its errors here."""

from ninja import NinjaAPI

from batches.api import register as register_batches
from inference.api.endpoints import register as register_inference

api = NinjaAPI(
    title="LLM platform API",
    version="1.0.0",
    description="OpenAI-compatible chat completions for paid tiers.",
    urls_namespace="v1",
)
register_inference(api)
# After inference: its error handlers cover the batches routes too.
register_batches(api)
