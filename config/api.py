"""The one NinjaAPI; each app contributes a Router and maps its errors here."""

from ninja import NinjaAPI

from inference.api.endpoints import register as register_inference

api = NinjaAPI(
    title="LLM platform API",
    version="1.0.0",
    description="OpenAI-compatible chat completions for paid tiers.",
    urls_namespace="v1",
)
register_inference(api)
