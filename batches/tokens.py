"""A batch's enqueued tokens: what counts against the tier's batch queue limit.

As OpenAI counts them: each line's prompt tokens plus all it may generate
(n x its output cap, the tier's when it sets none). Prompts are counted
with the model's tokenizer on their texts (without the chat template's few
tokens), or at four characters a token where the model is unknown or its
files are not there yet; such a line fails later anyway, or runs.
"""

from __future__ import annotations

from typing import Any

from fleet.selectors import catalog_model_get
from inference.errors import APIError
from inference.prompts.prepare import model_tokenizer
from tenants.models import Tier

# The legacy endpoint's default output cap (inference.api.completions).
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


class TokenCounter:
    """Counts lines' enqueued tokens for one tier, loading each tokenizer once."""

    def __init__(self, tier: Tier):
        self.tier = tier
        self._tokenizers: dict[str, Any] = {}

    def line_tokens(self, *, endpoint: str, body: dict[str, Any]) -> int:
        count = self._counter(body.get("model"))
        n = body.get("n") or 1
        cap = body.get("max_completion_tokens") or body.get("max_tokens")
        if endpoint == "/v1/completions":
            prompts = body.get("prompt")
            if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
                prompts = [prompts]
            cap = cap or COMPLETIONS_DEFAULT_MAX_TOKENS
            return sum(count(p) + n * cap for p in prompts or [])
        texts = [_text(m.get("content")) for m in body.get("messages") or []]
        return sum(count(t) for t in texts) + n * (cap or self.tier.max_output_tokens)

    def _counter(self, model_name: str | None):
        if model_name not in self._tokenizers:
            self._tokenizers[model_name] = self._load(model_name)
        tokenizer = self._tokenizers[model_name]

        def count(prompt) -> int:
            if isinstance(prompt, list):
                return len(prompt)
            if tokenizer is None:
                return (len(prompt) + 3) // 4
            return len(tokenizer.encode(prompt, add_special_tokens=False))

        return count

    def _load(self, model_name: str | None):
        model = catalog_model_get(name=model_name, tier=self.tier) if model_name else None
        if model is None:
            return None
        try:
            return model_tokenizer(model)
        except APIError:
            return None


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""
